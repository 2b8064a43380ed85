"""What a calibration times for each preset: a pure function of the preset, the probe and the hints."""

from __future__ import annotations

import pytest

from calibration_helpers import machine

from mixprec.calibration import candidates
from mixprec.policy.presets import UnknownPresetError


def _labels(found):
    return [c.label for c in found]


def test_fast_on_a_cpu_with_both_16_bit_types_native():
    found = candidates("fast", machine(bf16=3.0, fp16=1.1))
    labels = _labels(found)
    # Tried in this order: a time limit may stop the first calls before the last.
    assert labels[:4] == ["rules", "fp32", "naive-bf16", "naive-fp16"]
    assert {"rules-fp16", "rules-no-matmul", "fp32-medium", "naive-bf16", "naive-fp16"} <= set(labels)
    by = {c.label: c for c in found}
    # The one-line cast: every module in the type and no wrapper at all, as model.to(dtype).
    assert by["naive-bf16"].policy.wrappers == "none" and by["rules-no-matmul"].policy.wrappers == "auto"
    assert {r.storage for r in by["rules"].policy.rules if r.storage} == {"bf16"}
    assert {r.storage for r in by["rules-fp16"].policy.rules if r.storage} == {"fp16"}
    assert by["rules-no-matmul"].policy.numerics is None and by["rules"].policy.numerics.matmul == "medium"
    assert by["fp32"].policy is None and all(c.eligible for c in found)


def test_an_emulated_type_is_never_a_candidate():
    labels = _labels(candidates("fast", machine(bf16=3.0, fp16=0.01)))
    assert not any("fp16" in label for label in labels)


def test_identical_policies_are_timed_once_and_named_together():
    # No 16-bit type known fast: fast's rules are fp32 weights at matmul 'medium', which is fp32-medium.
    found = {c.label: c for c in candidates("fast", machine(flags=(), klass={"bf16": "undecided", "fp16": "undecided"}))}
    assert found["rules"].also == ("fp32-medium",) and "fp32-medium" not in found


def test_memory_chooses_among_16_bit_storage_only():
    found = {c.label: c for c in candidates("memory", machine())}
    assert not found["fp32"].eligible
    assert all(c.eligible for label, c in found.items() if label != "fp32" and not label.startswith("fp32-"))


def test_rules_that_keep_fp32_still_try_each_native_16_bit_type():
    # The probe could not decide and no flag states bf16: the rules keep fp32; the calibration asks the model.
    hw = machine(bf16=3.0, fp16=1.1, flags=(), klass={"bf16": "undecided", "fp16": "undecided"})
    found = {c.label: c for c in candidates("fast", hw)}
    assert {r.storage for r in found["rules"].policy.rules if r.storage} == {"fp32"}
    assert not any(label.startswith("rules-") and label != "rules-no-matmul" for label in found)  # nothing native known


def test_quality_has_nothing_to_choose_and_a_bad_name_is_refused():
    assert _labels(candidates("quality", machine())) == ["rules", "fp32"]
    with pytest.raises(UnknownPresetError, match="unknown preset 'fasst'.*fast"):
        candidates("fasst", machine())
