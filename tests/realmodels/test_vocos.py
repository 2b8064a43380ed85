"""Vocos (``vocos`` from PyPI): a vocoder of another family than HiFi-GAN, a ConvNeXt
backbone and an inverse-STFT head, under every policy, through its own entry points.

``Vocos.decode(mel)`` is a method other than ``forward`` (the way apps such as F5-TTS
call it); ``vocos(audio)`` is copy synthesis: a mel spectrogram from torchaudio, the
backbone, then the head's own ``ISTFT`` module (``torch.fft.irfft``, no 16-bit CPU
kernel). Built from its classes with seeded random weights at 8 kHz; nothing is
downloaded. Installed with ``--no-deps`` (tools/requirements-models-nodeps.txt).
"""

from __future__ import annotations

import pytest
import torch

from realmodels_harness import Case, check_combination, combos, compare_waveform


def _vocos():
    pytest.importorskip("vocos", reason="install it with: pip install --no-deps -r tools/requirements-models-nodeps.txt")
    from vocos import Vocos
    from vocos.feature_extractors import MelSpectrogramFeatures
    from vocos.heads import ISTFTHead
    from vocos.models import VocosBackbone

    torch.manual_seed(0)
    features = MelSpectrogramFeatures(sample_rate=8000, n_fft=256, hop_length=64, n_mels=32, padding="center")
    backbone = VocosBackbone(input_channels=32, dim=64, intermediate_dim=128, num_layers=2)
    head = ISTFTHead(dim=64, n_fft=256, hop_length=64, padding="center")
    return Vocos(features, backbone, head).eval()


AUDIO = torch.randn(1, 4000, generator=torch.Generator().manual_seed(1)) * 0.1


@pytest.fixture(scope="module")
def vocos_decode() -> Case:
    model = _vocos()
    with torch.no_grad():
        mel = model.feature_extractor(AUDIO)
    return Case(model, {"vocos": model}, lambda: model.decode(mel),
                lambda ref, out, tier: compare_waveform(ref, out, tier)).record_reference()


@pytest.fixture(scope="module")
def vocos_copy_synthesis() -> Case:
    model = _vocos()
    return Case(model, {"vocos": model}, lambda: model(AUDIO),
                lambda ref, out, tier: compare_waveform(ref, out, tier)).record_reference()


def test_vocos_reference_is_a_waveform(vocos_decode, vocos_copy_synthesis):
    assert vocos_decode.reference.shape == vocos_copy_synthesis.reference.shape == (1, 3968)  # 62 hops of 64
    assert vocos_decode.reference.std() > 0


@pytest.mark.parametrize(("policy", "hw"), combos(), indirect=["hw"])
def test_vocos_decode(vocos_decode, policy, hw, record_property):
    check_combination(vocos_decode, policy, hw, record_property)


@pytest.mark.parametrize(("policy", "hw"), [("bf16-native", "measured"), ("memory", "bf16-fast"),
                                            ("fp16-storage-fp32-compute", "measured")], indirect=["hw"])
def test_vocos_copy_synthesis(vocos_copy_synthesis, policy, hw, record_property):
    check_combination(vocos_copy_synthesis, policy, hw, record_property)


@pytest.mark.parametrize(("policy", "hw"), [("bf16-native", "measured"), ("balanced", "bf16-fast")], indirect=["hw"])
def test_vocos_decode_under_the_guard(vocos_decode, policy, hw, record_property):
    check_combination(vocos_decode, policy, hw, record_property, guard=True)
