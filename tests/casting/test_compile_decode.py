"""Compiled policies on whole pipelines: no recompiles, no recompile-limit warnings, guarded
or not, and token decoding through a static key/value cache (one compiled step for all positions).

Recompiles are read from Dynamo's own ``recompiles`` log (each one logs "Recompiling
function ..."), its recompile-limit warnings from its log too. Components are compiled with
the ``eager`` backend: traced exactly as with inductor, without generating code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import pytest
import torch
import torch._dynamo

import mixprec
from mixprec import CompileSettings, hardware, pipelines
from mixprec.casting import decode as decode_module
from mixprec.diagnose.fallbacks import FallbackStore

from test_compile import MODEL_INHERENT, SHALLOW

transformers = pytest.importorskip("transformers")


class _Log(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []
        self.break_reasons: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def recompiles(self) -> list[str]:
        return [m.splitlines()[0] for m in self.messages if m.startswith("Recompiling function")]

    def breaks(self) -> list[str]:
        """Graph-break reasons other than those inherent to the model's own layers (an LSTM)."""
        return sorted(r for r in self.break_reasons if not r.startswith(MODEL_INHERENT))

    def limits(self) -> list[str]:
        return [m for m in self.messages if "recompile_limit" in m or "cache_size_limit" in m]


@contextlib.contextmanager
def dynamo_log():
    """Dynamo's recompile reasons and warnings, collected while the block runs; logging put back after."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch._logging.set_logs(recompiles=True)
    handler = _Log()
    logger = logging.getLogger("torch._dynamo")  # where torch sends them (it does not propagate further)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        handler.break_reasons = {str(reason).splitlines()[0] for reason in torch._dynamo.utils.counters["graph_break"]}
        logger.removeHandler(handler)
        torch._logging.set_logs()
        torch._dynamo.reset()


def _compiled(policy: mixprec.Policy) -> mixprec.Policy:
    return dataclasses.replace(policy, compile=CompileSettings(backend="eager"))


@pytest.mark.parametrize("name", ["tts", "diffusion", "minilm"])
def test_every_preset_compiles_once_with_the_guard(name, bf16_cpu, tmp_path):
    """Two runs of the whole pipeline per preset, compiled by the policy and guarded: the first
    traces, nothing recompiles (a decoder's steps included), no recompile-limit warning, no graph
    break but the model's own. (Unguarded, each component's call: ``test_compile.py``.)"""
    hw = hardware.probe()
    pipe = pipelines.get(name, size="test", seed=0, **SHALLOW[name])
    inputs = pipe.example_inputs(1, 0)
    for preset in ("fast", "balanced", "memory"):
        applied = mixprec.apply(pipe, _compiled(mixprec.preset(preset, hardware=hw, hints=tuple(pipe.sensitive))))
        guard = mixprec.guard(applied, on_nonfinite="fallback", store=FallbackStore(tmp_path / "f.json"))
        try:
            with dynamo_log() as log, torch.no_grad():
                outputs = [pipe.run(inputs) for _ in range(2)]  # the first traces; every recompile is logged
        finally:
            guard.remove()
            applied.revert()
        where = f"{name}/{preset}"
        assert log.limits() == [], where
        assert log.recompiles() == [], where
        assert log.breaks() == [], where
        assert torch.equal(outputs[0].output, outputs[1].output), where


def _decoder(max_positions: int = 64) -> torch.nn.Module:
    config = transformers.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _greedy(model, prompt: torch.Tensor, steps: int) -> tuple[list[int], object]:
    """An app's own decoding loop: a prefill with use_cache=True, then one token per call."""
    out = model(input_ids=prompt, use_cache=True)
    tokens = []
    for _ in range(steps):
        token = out.logits[:, -1].argmax(-1)
        tokens.append(int(token))
        out = model(input_ids=token[:, None], past_key_values=out.past_key_values, use_cache=True)
    return tokens, out.past_key_values


def test_an_apps_decoding_loop_runs_one_compiled_step_on_a_static_cache_and_revert_restores_it(bf16_cpu):
    model = _decoder()
    prompt = torch.tensor([[1, 5, 7, 9]])
    policy = mixprec.preset("fast", hardware=hardware.probe())
    applied = mixprec.apply(model, policy)
    with torch.no_grad():
        expected, eager_cache = _greedy(model, prompt, 12)
    applied.revert()
    assert not isinstance(eager_cache, transformers.StaticCache)

    applied = mixprec.apply(model, _compiled(policy))
    assert model.generation_config.cache_implementation == "static"  # generate() decodes on a static cache too
    with dynamo_log() as log, torch.no_grad():
        tokens, cache = _greedy(model, prompt, 12)
        again, _ = _greedy(model, prompt, 12)
    applied.revert()
    assert isinstance(cache, transformers.StaticCache)
    assert tokens == expected == again  # the same greedy tokens as the eager policy, every time
    assert log.recompiles() == [] and log.limits() == []  # one decode step for every position
    assert model.generation_config.cache_implementation is None
    with torch.no_grad():
        assert not isinstance(_greedy(model, prompt, 2)[1], transformers.StaticCache)  # revert: the model's own cache


def test_a_static_cache_doubles_in_place_when_the_decoding_runs_past_it(bf16_cpu, monkeypatch):
    monkeypatch.setattr(decode_module, "HEADROOM", 3)
    model = _decoder(max_positions=40)
    prompt = torch.tensor([[2, 4]])
    policy = mixprec.preset("fast", hardware=hardware.probe())
    applied = mixprec.apply(model, policy)
    with torch.no_grad():
        expected, _ = _greedy(model, prompt, 30)
    applied.revert()
    applied = mixprec.apply(model, _compiled(policy))
    with dynamo_log() as log, torch.no_grad():
        tokens, cache = _greedy(model, prompt, 30)
    applied.revert()
    assert tokens == expected
    capacity = cache.layers[0].keys.shape[2]
    assert capacity == 40  # 5 -> 10 -> 20 -> 40: doubled, capped at max_position_embeddings
    assert int(cache.layers[0].cumulative_length) == 32
    assert len(log.recompiles()) <= 3 and log.limits() == []  # one per doubling at most, not one per token


def test_the_guard_rewinds_a_static_cache_before_it_reruns_a_decoding_step(bf16_cpu, tmp_path):
    from mixprec.diagnose.calls import RecordedCall

    cache = transformers.StaticCache(config=_decoder().config, max_cache_len=8)
    keys = torch.randn(1, 2, 3, 8)
    for layer_index in range(2):
        cache.update(keys, keys, layer_index)
    call = RecordedCall.record(lambda **k: None, (), {"past_key_values": cache})
    for layer_index in range(2):
        cache.update(keys[:, :, :1], keys[:, :, :1], layer_index)  # the failed call wrote one more position
    assert int(cache.get_seq_length()) == 4
    call.restore()
    assert int(cache.get_seq_length()) == 3 and cache.layers[0].is_initialized


def test_generate_and_a_batched_loop_with_its_attention_mask_decode_as_the_eager_policy_does(bf16_cpu):
    model = _decoder()
    prompt = torch.tensor([[1, 5, 7, 9], [2, 3, 4, 6]])
    policy = mixprec.Policy((mixprec.Rule("*", storage="bf16"),))

    def loop(steps: int = 8):
        mask = torch.ones(2, 4, dtype=torch.long)
        out = model(input_ids=prompt, attention_mask=mask, use_cache=True)
        tokens = []
        for _ in range(steps):
            token = out.logits[:, -1].argmax(-1)
            tokens.append(token)
            mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)  # the mask grows, as apps pass it
            out = model(input_ids=token[:, None], attention_mask=mask, past_key_values=out.past_key_values, use_cache=True)
        return torch.stack(tokens, dim=1), out.past_key_values

    def generated():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False, pad_token_id=0)

    applied = mixprec.apply(model, policy)
    with torch.no_grad():
        expected_tokens, _ = loop()
        expected_generated = generated()
    applied.revert()
    applied = mixprec.apply(model, _compiled(policy))
    with torch.no_grad():
        tokens, cache = loop()
        assert torch.equal(generated(), expected_generated)
    applied.revert()
    assert torch.equal(tokens, expected_tokens) and isinstance(cache, transformers.StaticCache)
