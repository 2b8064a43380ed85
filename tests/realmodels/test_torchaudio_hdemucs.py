"""Hybrid Demucs (torchaudio's ``torchaudio.models.HDemucs``): music source separation
through its own entry point, under every policy, apply alone and guarded.

The package's own class with ``hdemucs_low``'s STFT size and depth (nfft 1024, depth 5,
for audio around 8 kHz) and 8 channels instead of 48, seeded; nothing is downloaded.
It separates a synthetic stereo mixture (a bass line, a kick and a hi-hat, a voice-like
chirp) into four sources through both of its branches: a time branch of strided
convolutions, and a frequency branch on ``torch.stft`` of the mixture whose complex
spectrum is viewed as real channels (``view_as_real``) and back
(``view_as_complex``, ``torch.istft``); its deepest layers hold an LSTM and local
attention, its encoders ``GroupNorm``. Only torchaudio's pure-Python parts are used
(see tools/torchaudio_pure.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from realmodels_harness import (GUARDED, Case, check_combination, check_fp32_after_revert, check_guarded, combos,
                                compare_waveform)

SAMPLE_RATE = 8000
SOURCES = ["drums", "bass", "other", "vocals"]


def _mixture(samples: int = 8192) -> torch.Tensor:
    """(1, 2, samples): bass, kick and hi-hat, a chirp; panned differently per channel."""
    t = torch.arange(samples) / SAMPLE_RATE
    bass = 0.3 * torch.sin(2 * math.pi * 55 * t)
    beat = (t * 4) % 1.0
    kick = 0.5 * torch.exp(-beat * 30) * torch.sin(2 * math.pi * 60 * beat)
    hat = 0.05 * torch.randn(samples, generator=torch.Generator().manual_seed(1)) * ((t * 8) % 1.0 < 0.05)
    voice = 0.2 * torch.sin(2 * math.pi * torch.cumsum(300 + 200 * t, 0) / SAMPLE_RATE)
    left, right = bass + kick + hat + 0.7 * voice, bass + kick + 0.5 * hat + 1.3 * voice
    return torch.stack([left, right]).unsqueeze(0)


@pytest.fixture(scope="module")
def hdemucs() -> Case:
    HDemucs = pytest.importorskip("torchaudio.models").HDemucs  # an optional package (tools/torchaudio_pure.py)

    torch.manual_seed(0)
    model = HDemucs(sources=SOURCES, channels=8, nfft=1024, depth=5).eval()
    mixture = _mixture()
    return Case(model, {"": model}, lambda: model(mixture),
                lambda ref, out, tier: compare_waveform(ref, out, tier, "sources")).record_reference()


def test_hdemucs_reference_separates_four_stereo_sources(hdemucs):
    ref = hdemucs.reference
    assert ref.shape == (1, len(SOURCES), 2, 8192)
    assert all(ref[0, i].std() > 0 for i in range(len(SOURCES)))


@pytest.mark.parametrize(("policy", "hw"), combos(), indirect=["hw"])
def test_hdemucs_separation(hdemucs, policy, hw, record_property):
    check_combination(hdemucs, policy, hw, record_property)
    check_fp32_after_revert(hdemucs)


@pytest.mark.parametrize(("policy", "hw"), GUARDED, indirect=["hw"])
def test_hdemucs_under_the_guard(hdemucs, policy, hw, record_property):
    check_guarded(hdemucs, policy, hw, record_property)
