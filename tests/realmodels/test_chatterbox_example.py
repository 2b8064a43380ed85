"""The Chatterbox TTS example (examples/chatterbox_tts.py): the real package's classes, random weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("chatterbox.models.t3", reason="chatterbox-tts is not installed")

from typer.testing import CliRunner  # noqa: E402

from mixprec import pipelines  # noqa: E402
from mixprec.cli import app  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "chatterbox_tts.py"
SPEC = f"{EXAMPLE}:pipeline"


@pytest.fixture(scope="module")
def chatterbox(chatterbox_pipeline):
    """The test-size pipeline (built once a session: S3Gen alone has 264M weights, see conftest.py) and one
    fp32 run of batch 1, seed 0 (on one intra-op thread, conftest.py's module fixture)."""
    pipe = chatterbox_pipeline
    inputs = pipe.example_inputs(batch=1, seed=0)
    reference = pipe.run(inputs)
    return pipe, inputs, reference


def test_factory_builds_the_real_classes(chatterbox):
    from chatterbox.models.s3gen import S3Gen
    from chatterbox.models.t3 import T3
    from chatterbox.models.voice_encoder import VoiceEncoder

    pipe, inputs, _ = chatterbox
    assert isinstance(pipe, pipelines.Pipeline)
    assert pipe.output_kind == "audio" and pipe.sample_rate == 24000
    parts = pipe.components
    assert list(parts) == ["t3", "s3gen", "ve"]
    assert isinstance(parts["t3"], T3) and isinstance(parts["s3gen"], S3Gen) and isinstance(parts["ve"], VoiceEncoder)
    assert parts["t3"].cfg.num_hidden_layers == 2 and parts["t3"].cfg.hidden_size == 1024
    assert parts["t3"].cfg.intermediate_size == 1024
    assert pipe.resolve_hints()  # every hint family matches real module names
    assert {"t3.speech_head", "ve.lstm", "s3gen.mel2wav.conv_post"} <= set(pipe.resolve_hints())
    # synthetic 16 kHz voice and random text ids without the start (255) / stop (0) tokens
    assert inputs.reference_wav.shape == (1, 16000)
    assert inputs.text_tokens.dtype == torch.long
    assert int(inputs.text_tokens.min()) >= 1 and int(inputs.text_tokens.max()) < 704
    assert not bool((inputs.text_tokens == 255).any())


def test_fp32_run_is_deterministic(chatterbox):
    pipe, inputs, reference = chatterbox
    assert isinstance(reference, pipelines.AudioOutput)
    assert reference.sample_rate == 24000 and reference.token_agreement is None
    wave = reference.waveform
    assert wave.dtype == torch.float32 and wave.shape[0] == 1 and wave.shape[1] > 0
    assert bool(torch.isfinite(wave).all()) and float(wave.abs().max()) > 0
    tokens = reference.speech_tokens
    assert tokens.shape == (1, pipe.max_new_tokens) or int(tokens[0, -1]) == 6562  # stopped early only at the stop token
    # each renderable token (< 6561) becomes 2 mel frames of 480 samples
    assert wave.shape[1] == int((tokens[0] < 6561).sum()) * 2 * 480
    again = pipe.run(inputs)
    assert torch.equal(again.speech_tokens, tokens)
    assert torch.equal(again.waveform, wave)


def test_teacher_forcing_on_fp32_agrees_fully(chatterbox):
    pipe, inputs, reference = chatterbox
    forced = pipe.run(pipe.teacher_forced(inputs, reference))
    assert forced.token_agreement == 1.0
    assert torch.equal(forced.speech_tokens, reference.speech_tokens)
    assert torch.equal(forced.waveform, reference.waveform)
    # the keyword form the benchmark workers use gives the same
    assert pipe.run(inputs, speech_tokens=reference.speech_tokens).token_agreement == 1.0
    with pytest.raises(ValueError, match="speech_tokens must be an int64 tensor of shape"):
        pipe.run(inputs, speech_tokens=reference.speech_tokens.float())


def test_explain_through_the_cli(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("CHATTERBOX_CKPT_DIR", raising=False)
    result = CliRunner().invoke(app, ["explain", "--pipeline", "examples/chatterbox_tts.py:pipeline", "--size", "test",
                                      "--preset", "memory", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["module"]: r for r in json.loads(result.output)["modules"]}
    assert rows["t3.tfmr.layers.0.self_attn.q_proj"]["storage"] == "bf16"
    assert rows["s3gen.flow.decoder.estimator.final_proj"]["type"] == "Conv1d"
    assert any(name.startswith("ve.") for name in rows)


def test_bad_checkpoints_and_sizes_say_what_is_wrong(tmp_path, monkeypatch):
    module = pipelines.load_factory(SPEC).__globals__
    monkeypatch.delenv("CHATTERBOX_CKPT_DIR", raising=False)
    with pytest.raises(ValueError, match="unknown chatterbox size 'huge'; valid sizes: full"):
        module["pipeline"](size="huge")
    (tmp_path / "ve.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="lacks t3_cfg.safetensors, s3gen.safetensors"):
        module["pipeline"](ckpt_dir=tmp_path)
    monkeypatch.setenv("CHATTERBOX_CKPT_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="CHATTERBOX_CKPT_DIR=.*nowhere' is not a folder"):
        module["pipeline"]()
    with pytest.raises(ValueError, match="size 'test' builds a 2-layer T3 the real weights do not fit"):
        module["pipeline"](size="test")
    monkeypatch.delenv("CHATTERBOX_CKPT_DIR")
    with pytest.raises(ValueError, match="voice 'missing.wav' is neither 'builtin' nor an existing audio file"):
        module["pipeline"](size="test", voice="missing.wav")
