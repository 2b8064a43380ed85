"""EnCodec (``encodec`` from PyPI, Meta's own package): a neural audio codec through its
own entry points, under every policy, apply alone and guarded.

The package's own classes (``SEANetEncoder``, ``SEANetDecoder``, ``ResidualVectorQuantizer``
in an ``EncodecModel``), tiny and seeded: 8 kHz mono, 16 samples a frame, 4 codebooks of
64 codes set by the package's own k-means init; nothing is downloaded. Its convolutions use torch's old ``weight_norm`` (a
forward pre-hook that computes ``weight`` from ``weight_g`` and ``weight_v``), its
encoder and decoder hold an LSTM, and its quantizer's codebooks are buffers that the
codebook's own methods read (``x @ self.embed.t()`` to find the nearest code,
``F.embedding(codes, self.embed)`` to decode), not through a layer's forward.

* ``model.encode(wav)`` then ``model.decode(frames)``: codes and waveform. Codes are an
  argmax over distances: a 16-bit encoder may pick a neighbouring code, which changes
  the waveform by design, so the waveform is compared sample by sample where the codes
  agree; agreement is reported.
* Inside the block, the fp32 run's codes are decoded with the policy applied, and the
  encoder's embedding is compared with fp32's: both are compared sample by sample
  whatever the codes.

Installed with ``--no-deps`` (tools/requirements-models-nodeps.txt; vocos needs it too).
"""

from __future__ import annotations

import math

import pytest
import torch

from realmodels_harness import (GUARDED, Case, check_combination, check_fp32_after_revert, check_guarded, combos,
                                compare_waveform)

SAMPLE_RATE = 8000


def _encodec():
    pytest.importorskip("encodec", reason="install it with: pip install --no-deps -r tools/requirements-models-nodeps.txt")
    from encodec import EncodecModel
    from encodec.modules import SEANetDecoder, SEANetEncoder
    from encodec.quantization import ResidualVectorQuantizer

    torch.manual_seed(0)
    # Strides 4, 2, 2 into the encoder. (With 16 input channels, a kernel of 8 and a stride
    # of 4 (ratios [4, 4, 2]), torch 2.13's oneDNN bf16 conv1d returns wrong values on an
    # AMX Xeon, -1 dB against fp32, in plain torch without mixprec.)
    seanet = dict(channels=1, dimension=32, n_filters=4, ratios=[2, 2, 4], lstm=1, causal=True, norm="weight_norm")
    encoder, decoder = SEANetEncoder(**seanet), SEANetDecoder(**seanet)
    quantizer = ResidualVectorQuantizer(dimension=32, n_q=4, bins=64, kmeans_iters=10)
    # 4 codebooks x 6 bits x 500 frames/s = 12 kbps.
    model = EncodecModel(encoder, decoder, quantizer, target_bandwidths=[12.0], sample_rate=SAMPLE_RATE, channels=1,
                         name="encodec_tiny").eval()
    with torch.no_grad():
        # The codebooks start empty and are set by k-means on the first batch the quantizer
        # sees (the package's own init): here a second of another waveform.
        model.quantizer(model.encoder(_waveform(1.0, seed=2)), model.frame_rate)
    return model


def _waveform(seconds: float = 0.5, seed: int = 1) -> torch.Tensor:
    t = torch.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    phase = 2 * math.pi * torch.cumsum(200 + 300 * t, 0) / SAMPLE_RATE
    noise = torch.randn(t.shape, generator=torch.Generator().manual_seed(seed)) * 0.01
    return (0.3 * torch.sin(phase) * (0.6 + 0.4 * torch.sin(2 * math.pi * 4 * t)) + noise).view(1, 1, -1)


@pytest.fixture(scope="module")
def encodec_codec() -> Case:
    model = _encodec()
    model.set_target_bandwidth(12.0)
    wav = _waveform()

    def run():
        frames = model.encode(wav)
        return {"codes": frames[0][0], "audio": model.decode(frames)}

    def compare(ref, out, tier):
        codes, ref_codes = out["codes"], ref["codes"]
        assert codes.shape == ref_codes.shape and codes.dtype == torch.int64, (codes.shape, codes.dtype)
        assert int(codes.min()) >= 0 and int(codes.max()) < model.quantizer.bins
        metrics = {"code_agreement": (codes == ref_codes).float().mean().item()}
        if torch.equal(codes, ref_codes):
            metrics.update(compare_waveform(ref["audio"], out["audio"], tier, "audio"))
        else:  # another code: another (valid) piece of audio, compared inside the block from fp32's codes
            assert out["audio"].shape == ref["audio"].shape and torch.isfinite(out["audio"]).all()
        return metrics

    reference_emb: dict[str, torch.Tensor] = {}

    def inside(case, tier):
        # The fp32 codes through the policy's quantizer and decoder, and the policy's encoder.
        decoded = model.decode([(case.reference["codes"], None)])
        metrics = compare_waveform(case.reference["audio"], decoded, tier, "decoded")
        metrics.update(compare_waveform(reference_emb["emb"], model.encoder(wav), tier, "embedding"))
        return metrics

    case = Case(model, {"": model}, run, compare, inside=inside).record_reference()
    with torch.no_grad():
        reference_emb["emb"] = model.encoder(wav)
    return case


def test_encodec_reference_is_a_coded_waveform(encodec_codec):
    codes, audio = encodec_codec.reference["codes"], encodec_codec.reference["audio"]
    assert codes.shape == (1, 4, 250)  # 4000 samples / 16 a frame, 4 codebooks
    assert audio.shape == (1, 1, 4000) and audio.abs().max() > 0
    assert len(torch.unique(codes)) >= 8


@pytest.mark.parametrize(("policy", "hw"), combos(), indirect=["hw"])
def test_encodec_encode_decode(encodec_codec, policy, hw, record_property):
    check_combination(encodec_codec, policy, hw, record_property)
    check_fp32_after_revert(encodec_codec)


@pytest.mark.parametrize(("policy", "hw"), GUARDED, indirect=["hw"])
def test_encodec_under_the_guard(encodec_codec, policy, hw, record_property):
    check_guarded(encodec_codec, policy, hw, record_property)
