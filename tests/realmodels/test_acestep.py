"""ACE-Step end to end (``examples/acestep_music.py``): its UMT5 text encoder, its own
diffusion loop (``ACEStepPipeline.text2music_diffusion_process``) over
``ACEStepTransformer2DModel``, then ``MusicDCAE.decode``: the vocoder's waveform handed to
torchaudio's resampling inside the component's own method. Under every policy, with
apply alone and under the guard; revert must be bit-exact, including the lyric
encoder's positional table that ACE-Step caches as a plain attribute.

ACE-Step is not on PyPI in a usable form, so this skips where it is not installed; see
examples/acestep_music.py for the install steps.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from realmodels_harness import Case, check_combination, combos, compare_waveform

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("acestep") is None,
    reason="ACE-Step is not installed: git clone https://github.com/ace-step/ACE-Step && git -C ACE-Step checkout "
           "a5746ea && pip install --no-deps -e ACE-Step && pip install loguru pypinyin hangul-romanize num2words spacy "
           "py3langid (see examples/acestep_music.py)")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def acestep() -> Case:
    sys.path.insert(0, str(EXAMPLES))
    try:
        import acestep_music
    finally:
        sys.path.remove(str(EXAMPLES))
    pipe = acestep_music.pipeline(size="test", seed=0)
    inputs = pipe.example_inputs(1, 0)
    case = Case(pipe, dict(pipe.components), lambda: pipe.run(inputs).output,
                lambda ref, out, tier: compare_waveform(ref, out, tier)).record_reference()
    case.state["pipe"] = pipe
    return case


def test_acestep_reference_is_music_length_audio(acestep):
    assert acestep.reference.shape[0] == 1 and acestep.reference.shape[1] > 48000 and acestep.reference.std() > 0


@pytest.mark.parametrize(("policy", "hw"), combos(), indirect=["hw"])
def test_acestep(acestep, policy, hw, record_property):
    check_combination(acestep, policy, hw, record_property)


@pytest.mark.parametrize(("policy", "hw"), [pytest.param(p, h, id=f"{p}-{h}") for p in
                                            ("balanced", "fast", "memory", "bf16-native", "fp16-storage-fp32-compute")
                                            for h in ("measured",)] + [pytest.param("fast", "bf16-fast", id="fast-bf16-fast")],
                         indirect=["hw"])
def test_acestep_under_the_guard(acestep, policy, hw, record_property):
    """Any pin the guard makes must be narrower than a component (the harness checks); here none is needed."""
    metrics = check_combination(acestep, policy, hw, record_property, guard=True)
    assert metrics.get("guard pins", "none") in ("none", [], ())


def test_acestep_first_fp32_run_after_revert_is_bit_identical(acestep):
    """ACE-Step's lyric encoder caches its positional table as a plain attribute and re-makes
    it in the dtype it meets: after a bf16 run and revert, fp32 must be exactly fp32 again."""
    import mixprec

    with mixprec.apply(acestep.target, mixprec.Policy((mixprec.Rule("*", storage="bf16"),))), torch.no_grad():
        acestep.run()
    with torch.no_grad():
        assert torch.equal(acestep.run(), acestep.reference)
