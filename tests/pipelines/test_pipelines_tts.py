"""The Chatterbox-shaped tts pipeline at test size."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mixprec import pipelines


@pytest.mark.parametrize("batch", [1, 2])
def test_tts_shapes_and_range(tts, batch):
    cfg = tts.config
    out = tts.run(tts.example_inputs(batch, 0))
    samples = cfg.num_tokens * cfg.frames_per_token * 480
    assert out.waveform.shape == (batch, samples)
    assert out.sample_rate == 24000
    assert out.speech_tokens.shape == (batch, cfg.num_tokens)
    assert out.speech_tokens.dtype == torch.long
    assert int(out.speech_tokens.max()) < cfg.n_speech_tokens
    assert out.token_agreement is None
    wave = out.waveform
    assert torch.isfinite(wave).all()
    assert wave.abs().max() <= 1.0
    assert wave.std() > 1e-2, "waveform is (nearly) silent"
    assert (wave.abs() > 0.99).float().mean() < 0.05, "vocoder saturates"


def test_tts_is_deterministic(tts):
    inputs = tts.example_inputs(2, 7)
    first, second = tts.run(inputs), tts.run(inputs)
    assert torch.equal(first.waveform, second.waveform)
    assert torch.equal(first.speech_tokens, second.speech_tokens)
    other = pipelines.get("tts", size="test", seed=0)
    again = other.run(other.example_inputs(2, 7))
    assert torch.equal(first.waveform, again.waveform)


def test_tts_seed_changes_inputs_and_weights(tts):
    a = tts.run(tts.example_inputs(1, 0)).waveform
    b = tts.run(tts.example_inputs(1, 1)).waveform
    assert not torch.equal(a, b)
    other = pipelines.get("tts", size="test", seed=1)
    assert not torch.equal(other.run(other.example_inputs(1, 0)).waveform, a)


def test_teacher_forcing_replays_reference(tts):
    inputs = tts.example_inputs(2, 3)
    reference = tts.run(inputs)
    forced = tts.run(tts.teacher_forced(inputs, reference))
    assert forced.token_agreement == 1.0
    assert torch.equal(forced.speech_tokens, reference.speech_tokens)
    assert torch.equal(forced.waveform, reference.waveform)
    by_keyword = tts.run(inputs, speech_tokens=reference.speech_tokens)
    assert by_keyword.token_agreement == 1.0
    assert torch.equal(by_keyword.waveform, reference.waveform)


def test_teacher_forcing_with_other_tokens_reports_disagreement(tts):
    inputs = tts.example_inputs(1, 3)
    reference = tts.run(inputs)
    other = (reference.speech_tokens + 1) % tts.config.n_speech_tokens
    out = tts.run(dataclasses.replace(inputs, speech_tokens=other))
    assert torch.equal(out.speech_tokens, other)
    assert 0.0 <= out.token_agreement < 1.0
    assert not torch.equal(out.waveform, reference.waveform)


def test_teacher_forcing_validates_tokens(tts):
    inputs = tts.example_inputs(2, 0)
    with pytest.raises(ValueError, match="shape"):
        tts.run(inputs, speech_tokens=torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="ids in"):
        tts.run(inputs, speech_tokens=torch.full((2, 4), 10**6, dtype=torch.long))


def test_tts_components(tts):
    from transformers import LlamaForCausalLM

    assert list(tts.components) == ["ve", "t3_cond", "t3", "s3gen", "vocoder"]
    assert isinstance(tts.components["t3"], LlamaForCausalLM)
    assert "vocoder.conv_post" in tts.resolve_hints()


def test_large_size_is_chatterbox_scale_without_building_weights():
    from mixprec.pipelines._sizes import build_on_meta
    from mixprec.pipelines.tts import SIZE_NOTES, SIZES

    large = SIZES["large"]
    # At least what the GPU session measured (shared/gpu/gpu_factories.py: t3_large).
    assert (large.t3_layers, large.t3_hidden, large.t3_heads, large.t3_intermediate) == (30, 1024, 16, 4096)
    assert large.num_tokens == 100 and large.n_speech_tokens == 6561
    assert large.s3_dim >= 256 and large.voc_channels == 512
    assert set(SIZE_NOTES) == set(SIZES)
    pipe = build_on_meta("tts", size="large")  # shapes only: nothing is allocated
    assert all(p.is_meta for m in pipe.components.values() for p in m.parameters())
    counts = pipe.parameter_counts()
    assert 0.5e9 < counts["t3"] < 0.55e9  # Chatterbox's 0.5B Llama
    assert counts["s3gen"] > 80e6 and counts["vocoder"] > 10e6
