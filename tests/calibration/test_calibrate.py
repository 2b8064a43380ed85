"""Calibrating a preset on a model: what is kept, what is ruled out, what is remembered.

Every test controls the clock (a :class:`DtypeClock` gives each call the seconds its weight
dtype and matmul level are scripted to take): no test times the machine.
"""

from __future__ import annotations

import math

import pytest
import torch

from calibration_helpers import MLP, DtypeClock, Ticks, by_dtype, machine

import mixprec
from mixprec.calibration import cache as decisions
from mixprec.calibration import calibrate
from mixprec.casting.apply import applied_part
from mixprec.policy.presets import UnknownPresetError


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def model():
    return MLP()


@pytest.fixture
def x():
    return torch.randn(4, 32, generator=torch.Generator().manual_seed(1))


def _calibrate(model, x, seconds, preset="fast", hw=None, **kw):
    return calibrate(model, preset, (x,), hardware=hw or machine(), clock=DtypeClock(model.layers[0], seconds),
                     cache=kw.pop("cache", False), **kw)


def test_the_fastest_candidate_that_meets_the_floor_is_kept_and_the_model_is_left_untouched(model, x):
    before = _state(model)
    # fp16 fastest, at matmul 'medium' faster still (the preset's level): the preset resolved with fp16.
    result = _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.3, fp16_medium=0.25))
    assert result.chosen == "rules-fp16" and result.decided and result.source == "measured"
    assert {r.storage for r in result.policy.rules if r.storage} == {"fp16"}
    fig = result.figure("rules-fp16")
    assert fig["vs_fp32"]["value"] == pytest.approx(4.0) and fig["status"] == "faster"
    assert result.figure("rules")["status"] == "incumbent"
    assert result.clock == "scripted" and result.rounds >= 5
    assert _same(before, _state(model)) and applied_part({"": model}) is None  # every candidate reverted
    assert any(r.startswith("kept rules-fp16: 2.00x") for r in result.reasons), result.reasons


def test_rules_slower_than_fp32_give_way_to_fp32_which_installs_nothing(model, x):
    result = _calibrate(model, x, by_dtype(fp32=1.0, bf16=2.0, fp16=3.0, fp32_medium=1.5))
    assert result.chosen == "fp32" and result.decided
    assert result.figure("fp32-medium")["status"] == "faster"  # faster than rules, slower than fp32
    before = _state(model)
    with mixprec.apply(model, result.policy) as applied:
        assert applied._handles == [] or all(not hasattr(h, "around") for h in applied._handles)
        assert next(model.parameters()).dtype == torch.float32
        assert torch.get_float32_matmul_precision() == "highest"
    assert _same(before, _state(model))


def test_a_candidate_below_the_floor_or_non_finite_or_failing_is_out(x):
    class Overflows(MLP):
        def forward(self, x):
            y = super().forward(x) * 300.0
            return y * y * y  # beyond fp16's 65,504 where computed in fp16

    model = Overflows()
    result = _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.1), floor_db=30.0)
    assert result.figure("naive-fp16")["out"].endswith("non-finite output values")
    assert result.chosen in ("rules", "naive-bf16", "rules-no-matmul", "fp32")
    strict = _calibrate(MLP(), x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.25), floor_db=300.0)
    assert strict.chosen == "fp32"
    out = strict.figure("rules")["out"]
    assert out.startswith("output SQNR") and "below fast's floor of 300 dB" in out
    assert any(r.startswith("rules out (output SQNR") for r in strict.reasons)


def test_a_candidate_that_raises_is_out_with_its_error(x):
    class Fft(MLP):
        def forward(self, x):
            y = super().forward(x)
            if y.dtype == torch.float16:
                raise RuntimeError("no fp16 kernel for this op here")
            return y

    result = _calibrate(Fft(), x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.25))
    assert result.figure("rules-fp16")["out"] == "failed: RuntimeError: no fp16 kernel for this op here"
    assert result.chosen == "rules"


def test_a_one_line_cast_the_model_cannot_run_is_out_and_the_wrapped_policies_run_it(x):
    """A model that feeds its fp32 inputs straight to its layers runs under ``model.to(bf16)`` only
    with mixprec's entry casts: the one-line casts are out with torch's own error, the preset runs."""
    model = MLP(casts_input=False)
    result = _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.3, fp16_medium=0.25))
    for label in ("naive-bf16", "naive-fp16"):
        assert result.figure(label)["out"].startswith("failed: RuntimeError: mat1 and mat2 must have the same dtype")
    assert result.chosen == "rules-fp16" and result.figure("rules")["sqnr_db"] > 20


def test_rounds_that_cannot_separate_the_candidates_keep_the_rule_based_choice(model, x):
    noisy = lambda dtype, matmul, n: 1.0 if n % 2 else 0.3  # noqa: E731 - every candidate scatters the same way
    result = _calibrate(model, x, noisy, time_limit=40.0, now=Ticks(1.0))
    assert result.chosen == "rules" and result.decided
    assert any(r.startswith("not separated after") and "the time limit (40 s)" in r for r in result.reasons), result.reasons


def test_a_time_limit_too_short_for_a_verdict_keeps_the_rule_based_choice_undecided(model, x):
    result = _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.25), time_limit=12.0, now=Ticks(1.0))
    assert result.chosen == "rules" and not result.decided and result.rounds < 5
    assert any(r.startswith("undecided:") and "the time limit (12 s)" in r for r in result.reasons), result.reasons
    assert result.headline().endswith("undecided: the rule-based choice stays")


def test_max_rounds_bounds_the_calls(model, x):
    result = _calibrate(model, x, lambda d, m, n: 1.0 + 0.5 * (n % 3 == 0), max_rounds=6)
    assert result.rounds <= 6


def test_a_decision_is_remembered_and_reused_without_running_the_model(model, x, tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    first = _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.25), cache=True)
    assert first.source == "measured" and first.cache_path and tmp_path.joinpath("calibrations").is_dir()
    model.calls = 0
    again = _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.25), cache=True)
    assert again.source == "cache" and model.calls == 0
    assert again.policy == first.policy and again.chosen == first.chosen
    assert again.reasons[0].startswith("remembered: decided on test cpu at ") and "the model was not run" in again.reasons[0]
    # Another input shape, another device description, another torch: measured again.
    wider = calibrate(model, "fast", (torch.randn(8, 32),), hardware=machine(), cache=True,
                      clock=DtypeClock(model.layers[0], by_dtype(fp32=1.0, bf16=0.5, fp16=0.25)))
    assert wider.source == "measured"
    other = _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.25), cache=True,
                       hw=machine(flags=("avx512_bf16", "amx_bf16")))
    assert other.source == "measured"
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.25), cache=True).source == "measured"
    monkeypatch.undo()
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    assert len(decisions.entries()) == 4
    assert decisions.clear("fast") == 4 and decisions.entries() == []
    assert _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.25), cache=True).source == "measured"


def test_refusing_the_cache_neither_reads_nor_writes_and_undecided_is_not_remembered(model, x, tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.25), cache=False)
    assert decisions.entries() == []
    noisy = _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.25), cache=True, time_limit=12.0, now=Ticks(1.0))
    assert not noisy.decided and decisions.entries() == []
    assert noisy.reasons[-1] == "not remembered: an undecided calibration is measured again by the next one"
    fresh = _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.25), cache=True)
    refreshed = _calibrate(model, x, by_dtype(fp32=1.0, bf16=2.0, fp16=2.0), cache="refresh")
    # Equal speeds: the simpler change wins (the one-line cast over the preset's extras, fp32 over fp32-medium).
    assert fresh.chosen == "naive-fp16" and refreshed.source == "measured" and refreshed.chosen == "fp32"
    assert _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.25), cache=True).chosen == "fp32"


def test_memory_keeps_reduced_weights_even_where_fp32_is_faster_and_fp8_where_its_floor_holds(model, x):
    result = _calibrate(model, x, by_dtype(fp32=1.0, bf16=2.0, fp16=1.5), preset="memory")
    assert result.chosen == "rules-fp8" and {r.storage for r in result.policy.rules if r.storage} == {"fp8"}
    assert result.figure("fp32")["eligible"] is False
    assert any("memory's fp8 level kept: output SQNR" in r and "MiB of weights against" in r for r in result.reasons)
    # the input cast reads layers[0]'s weight dtype (also the model's first weight): that layer
    # stays 16-bit, the others are fp8
    with mixprec.apply(model, result.policy) as applied:
        assert [layer.weight.dtype for layer in model.layers] == [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fn]
        assert "weight kept in bf16" in {r["module"]: r["reason"] for r in applied.explain()}["layers.0"]


def test_memory_keeps_16_bit_weights_where_fp8_misses_its_floor(model, x):
    sixteen = _calibrate(model, x, by_dtype(fp32=1.0, bf16=2.0, fp16=1.5), preset="memory")
    floor = sixteen.figure("rules-fp8")["sqnr_db"] + 1.0  # just above what fp8 measured here
    result = _calibrate(model, x, by_dtype(fp32=1.0, bf16=2.0, fp16=1.5), preset="memory", floor_db=floor)
    assert result.chosen != "rules-fp8" and {r.storage for r in result.policy.rules if r.storage} <= {"bf16", "fp16"}
    assert "below memory's floor" in result.figure("rules-fp8")["out"]


def test_quality_times_nothing(model, x):
    result = calibrate(model, "quality", (x,), hardware=machine(), cache=False)
    assert result.source == "rules" and result.chosen == "rules" and model.calls == 0


def test_bad_input_is_refused_before_anything_runs(model, x):
    with pytest.raises(UnknownPresetError, match="unknown preset 'fsat'"):
        calibrate(model, "fsat", (x,), hardware=machine())
    with pytest.raises(ValueError, match="calibrate needs example inputs for a MLP"):
        calibrate(model, "fast", hardware=machine())
    with pytest.raises(ValueError, match="cache='yes': choose True, False or 'refresh'"):
        calibrate(model, "fast", (x,), hardware=machine(), cache="yes")
    with pytest.raises(ValueError, match="the fp32 model itself failed on the example inputs"):
        calibrate(model, "fast", (torch.randn(2, 5),), hardware=machine(), cache=False)
    assert model.calls == 1  # only the reference ran, and failed
    with mixprec.apply(model, mixprec.preset("fast", hardware=machine())):
        with pytest.raises(mixprec.ApplyError, match="already has a mixprec policy applied"):
            calibrate(model, "fast", (x,), hardware=machine())


def test_apply_with_calibrate_applies_the_decision_and_reverts_bit_exactly(model, x, monkeypatch):
    before = _state(model)
    clock = DtypeClock(model.layers[0], by_dtype(fp32=1.0, bf16=0.5, fp16=0.25))
    with mixprec.apply(model, "fast", calibrate=(x,), hardware=machine(), clock=clock, cache=False) as applied:
        assert applied.calibration.chosen == "naive-fp16"
        assert model.layers[0].weight.dtype == torch.float16
        assert torch.isfinite(model(x)).all()
    assert _same(before, _state(model))
    again = mixprec.apply(model, "fast", calibrate=applied.calibration)  # a Calibration is applied as it is
    assert model.layers[0].weight.dtype == torch.float16
    again.revert()
    with pytest.raises(mixprec.ApplyError, match="calibrate= chooses among a preset's candidates"):
        mixprec.apply(model, mixprec.preset("fast", hardware=machine()), calibrate=(x,))
    with pytest.raises(mixprec.ApplyError, match="time_limit: options of calibrate="):
        mixprec.apply(model, "fast", time_limit=3)
    assert _same(before, _state(model))


def test_a_pipeline_is_calibrated_on_its_own_inputs_teacher_forced():
    from mixprec import pipelines

    pipe = pipelines.get("tts", size="test")
    t3 = pipe.components["t3"]
    result = calibrate(pipe, "fast", hardware=machine(), cache=False,
                       clock=DtypeClock(t3, by_dtype(fp32=1.0, bf16=0.5, fp16=0.7)))
    assert result.chosen in ("rules", "naive-bf16", "rules-no-matmul")
    assert math.isfinite(result.figure("rules")["sqnr_db"]) and result.figure("rules")["sqnr_db"] > 20


def test_a_calibration_round_trips(model, x):
    result = _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.25))
    again = mixprec.Calibration.from_dict(result.to_dict())
    assert again == result


def test_a_time_limit_reached_before_every_candidate_ran_once_leaves_the_rest_untried(model, x):
    result = _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.25), time_limit=8.0, now=Ticks(2.0))
    untried = [f["label"] for f in result.figures if (f["out"] or "").startswith("not tried: the time limit (8 s)")]
    assert untried and "rules" not in untried and result.figure("rules")["out"] is None
    assert "fp32" not in untried  # its first call was the reference run
    assert result.chosen == "rules" and not result.decided


def test_rules_below_the_floor_and_no_time_for_rounds_keep_the_untouched_model(model, x):
    result = _calibrate(model, x, by_dtype(fp32=1.0, bf16=0.5, fp16=0.25), floor_db=300.0, time_limit=3.0, now=Ticks(2.0))
    assert result.figure("rules")["out"].startswith("output SQNR") and result.chosen == "fp32"
    assert "only fp32 qualified: kept without timing" in result.reasons and not result.decided  # others not tried
    assert result.reasons[0].startswith("undecided: ") and "not tried within the time limit (3 s)" in result.reasons[0]


@pytest.mark.parametrize("preset", ["fast", "balanced"])
def test_nothing_to_choose_where_every_candidate_computes_what_fp32_does(model, x, preset):
    """No native 16-bit type and matmul levels that give fp32's bits (an AVX2-only CPU): the answer
    comes at once, the model never runs, and it says why."""
    import dataclasses

    avx2 = dataclasses.replace(machine(bf16=0.016, fp16=0.016, flags=("avx2",)), matmul_exact={"high": True, "medium": True})
    result = calibrate(model, preset, (x,), hardware=avx2, clock=DtypeClock(model.layers[0], by_dtype(fp32=1.0)), cache=False)
    assert (result.chosen, result.decided, result.source, model.calls) == ("fp32", True, "rules", 0)
    assert {r.storage for r in result.policy.rules} == {"fp32"} and result.policy.numerics is None
    assert result.reasons[0].startswith("nothing to choose on this device: no 16-bit type is native on test cpu")
    # A matmul level that changes the bits is something to choose: measured.
    changes = dataclasses.replace(avx2, matmul_exact={"high": False, "medium": False})
    measured = calibrate(model, preset, (x,), hardware=changes, clock=DtypeClock(model.layers[0], by_dtype(fp32=1.0)),
                         cache=False, max_rounds=5)
    assert measured.source == "measured" and model.calls > 0


def test_memory_still_checks_its_weights_where_nothing_else_is_native(model, x):
    import dataclasses

    avx2 = dataclasses.replace(machine(bf16=0.016, fp16=0.016, flags=("avx2",)), matmul_exact={"high": True, "medium": True})
    result = calibrate(model, "memory", (x,), hardware=avx2, clock=DtypeClock(model.layers[0], by_dtype(fp32=1.0)), cache=False)
    assert result.source == "measured" and model.calls > 0  # its 16-bit or fp8 weights change the output
