"""OpenAI Whisper (``openai-whisper`` from PyPI): speech recognition through the package's
own entry points, under every policy, apply alone and guarded.

The package's own classes (``whisper.model.Whisper(ModelDimensions(...))``), tiny and
seeded, with the English tokenizer whose tiktoken vocabulary ships inside the package
(nothing is downloaded). Its layers are written the way many apps write them: a
``LayerNorm`` subclass that normalises ``x.float()`` and casts back, ``Linear`` and
``Conv1d`` subclasses that cast their weights to the input's dtype, attention scores
softmaxed in fp32, and output logits computed by the decoder reading its own token
embedding's weight outside that embedding's forward. Decoding installs forward hooks
on the key/value projections (its KV cache) for the length of a call.

* ``whisper.decode(model, mel, DecodingOptions(...))``: greedy, a fixed number of steps
  (end-of-text suppressed, so every run makes the same number of steps); the mel is
  ``log_mel_spectrogram`` of a synthetic waveform. The per-step scores are the
  decoder's last-position logits through the task's own logit filters (what greedy
  search picks from), compared like any token model's.
* ``model.transcribe(audio)``: the whole app path (mel, padding, segments, the
  decode-with-fallback loop at temperature 0) from a waveform to text.

Installed with ``--no-deps`` (its requirements pull triton, which nothing here uses);
what its modules import (tiktoken, more-itertools, numba, tqdm) comes with the
``models`` extra.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from realmodels_harness import (GUARDED, Case, check_combination, check_fp32_after_revert, check_guarded,
                                check_pins_own_weights, combos,
                                compare_generation)

SAMPLE_RATE = 16000
STEPS = 6


def _waveform(seconds: float = 2.0) -> np.ndarray:
    """A chirp with harmonics and a little noise: what a voice's spectrum roughly looks like."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    f0 = 120 + 80 * t
    phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE
    voice = sum(np.sin(k * phase) / k for k in range(1, 6)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    noise = np.random.default_rng(3).standard_normal(t.shape) * 0.01
    return (0.1 * voice + noise).astype(np.float32)


@pytest.fixture(scope="module")
def whisper_app():
    whisper = pytest.importorskip("whisper", reason="install it with: pip install --no-deps -r tools/requirements-models-nodeps.txt")
    from whisper.model import ModelDimensions, Whisper

    torch.manual_seed(0)
    # English-only vocabulary size (51864): the package's gpt2 tiktoken file and its special tokens.
    # n_audio_ctx 1500 is the 30 s window transcribe() pads every segment to.
    dims = ModelDimensions(n_mels=80, n_audio_ctx=1500, n_audio_state=32, n_audio_head=2, n_audio_layer=2,
                           n_vocab=51864, n_text_ctx=64, n_text_state=32, n_text_head=2, n_text_layer=2)
    model = Whisper(dims).eval()
    # The decoder's positional embedding is created with torch.empty (a checkpoint fills it):
    # seeded values, as every other weight has.
    torch.nn.init.normal_(model.decoder.positional_embedding, std=0.02)
    tokenizer = whisper.tokenizer.get_tokenizer(multilingual=model.is_multilingual, task="transcribe", language="en")
    # fp16=False: whisper's own switch for fp32 inputs (the policy decides the weights);
    # end-of-text suppressed so that every run decodes STEPS tokens.
    options = whisper.DecodingOptions(language="en", without_timestamps=True, fp16=False, temperature=0.0,
                                      sample_len=STEPS, suppress_tokens=str(tokenizer.eot), suppress_blank=False)
    logits: dict[int, torch.Tensor] = {}

    def record(module, args, kwargs, output):
        # The decoder's last-position logits (whisper hands them to its logit filters, then
        # to greedy search), by the number of tokens in the KV cache after the call: a call
        # run again (the guard's fallback) replaces its entry, and must leave the cache as
        # one run does, or the entry lands elsewhere.
        cached = min(v.shape[1] for v in kwargs["kv_cache"].values())
        logits[cached] = output[:, -1].detach().float().clone()

    model.decoder.register_forward_hook(record, with_kwargs=True)
    return SimpleNamespace(whisper=whisper, model=model, tokenizer=tokenizer, options=options, logits=logits)


def _scores(app, recorded: dict[int, torch.Tensor], tokens: list[int]) -> list[torch.Tensor]:
    """The recorded logits through the decoding task's own logit filters, step by step."""
    from whisper.decoding import DecodingTask

    task = DecodingTask(app.model, app.options)
    prefix = list(task.initial_tokens)
    scores = []
    for step, raw in enumerate(recorded[n] for n in sorted(recorded)):
        step_logits = raw.clone()
        for logit_filter in task.logit_filters:
            logit_filter.apply(step_logits, torch.tensor([prefix]))
        scores.append(step_logits)
        if step < len(tokens):
            prefix.append(tokens[step])
    return scores


def _generation(app, recorded, tokens) -> SimpleNamespace:
    return SimpleNamespace(sequences=torch.tensor([tokens]), scores=_scores(app, recorded, tokens))


@pytest.fixture(scope="module")
def whisper_decode(whisper_app) -> Case:
    app = whisper_app
    whisper = app.whisper
    audio = torch.from_numpy(whisper.pad_or_trim(_waveform()))
    mel = whisper.log_mel_spectrogram(audio, app.model.dims.n_mels)

    def run():
        app.logits.clear()
        result = whisper.decode(app.model, mel, app.options)
        return {"result": result, "gen": _generation(app, dict(app.logits), result.tokens)}

    def compare(ref, out, tier):
        assert len(out["result"].tokens) == STEPS, out["result"].tokens
        assert out["result"].language == "en" and isinstance(out["result"].text, str)
        return compare_generation(ref["gen"], out["gen"], tier, vocab_size=app.model.dims.n_vocab, attr="scores")

    return Case(app.model, {"": app.model}, run, compare).record_reference()


@pytest.fixture(scope="module")
def whisper_transcribe(whisper_app) -> Case:
    app = whisper_app
    audio = _waveform()

    def run():
        app.logits.clear()
        result = app.model.transcribe(audio, language="en", temperature=0.0, fp16=False, without_timestamps=True,
                                      sample_len=STEPS, suppress_tokens=str(app.tokenizer.eot), suppress_blank=False,
                                      condition_on_previous_text=False, verbose=None)
        tokens = [t for segment in result["segments"] for t in segment["tokens"]]
        return {"result": result, "gen": _generation(app, dict(app.logits), tokens)}

    def compare(ref, out, tier):
        assert len(out["result"]["segments"]) == len(ref["result"]["segments"]) == 1, out["result"]["segments"]
        assert isinstance(out["result"]["text"], str)
        return compare_generation(ref["gen"], out["gen"], tier, vocab_size=app.model.dims.n_vocab, attr="scores")

    return Case(app.model, {"": app.model}, run, compare).record_reference()


def test_whisper_reference_decodes_every_step(whisper_decode, whisper_transcribe):
    for case in (whisper_decode, whisper_transcribe):
        gen = case.reference["gen"]
        assert gen.sequences.shape == (1, STEPS) and len(gen.scores) == STEPS
        # The task's filters masked the special tokens (end of text among them); the rest is finite.
        assert torch.isneginf(gen.scores[0]).sum() >= 5
        assert torch.isfinite(gen.scores[0]).sum() > 50000
    assert whisper_decode.reference["result"].tokens == [t for s in whisper_transcribe.reference["result"]["segments"]
                                                          for t in s["tokens"]]


@pytest.mark.parametrize(("policy", "hw"), combos(), indirect=["hw"])
def test_whisper_decode(whisper_decode, policy, hw, record_property):
    check_combination(whisper_decode, policy, hw, record_property)
    check_fp32_after_revert(whisper_decode)


@pytest.mark.parametrize(("policy", "hw"), [("bf16-native", "measured"), ("memory", "bf16-fast"),
                                            ("fp16-storage-fp32-compute", "measured")], indirect=["hw"])
def test_whisper_transcribe(whisper_transcribe, policy, hw, record_property):
    check_combination(whisper_transcribe, policy, hw, record_property)
    check_fp32_after_revert(whisper_transcribe)


@pytest.mark.parametrize(("policy", "hw"), GUARDED, indirect=["hw"])
def test_whisper_decode_under_the_guard(whisper_decode, policy, hw, record_property):
    check_guarded(whisper_decode, policy, hw, record_property)


@pytest.mark.parametrize(("policy", "hw"), [("bf16-native", "measured"), ("fp16-storage-fp32-compute", "measured")],
                         indirect=["hw"])
def test_whisper_transcribe_under_the_guard(whisper_transcribe, policy, hw, record_property):
    metrics = check_combination(whisper_transcribe, policy, hw, record_property, guard=True)
    check_pins_own_weights(whisper_transcribe, metrics)
    check_fp32_after_revert(whisper_transcribe)
