"""Llama, T5 and Whisper (transformers) under every policy and probe: greedy generation.

Tiny seeded models (hidden 32, 1-2 layers, a few tokens); see ``realmodels_harness``
for what each combination checks. The initialisation scale is raised (Llama std 0.2,
Whisper 0.5, T5 factor 2 with flan-T5's gated-gelu) so that the random models produce
varied tokens rather than repeating one id.
"""

from __future__ import annotations

import pytest
import torch

from realmodels_harness import Case, check_combination, check_guarded, combos, compare_generation

NEW_TOKENS = 6


def _greedy_case(model, ids: torch.Tensor, vocab_size: int) -> Case:
    """Greedy generation of NEW_TOKENS tokens from ``ids``, compared step by step with fp32."""

    def run():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                              eos_token_id=None, output_logits=True, return_dict_in_generate=True)

    def compare(ref, out, tier):
        return compare_generation(ref, out, tier, vocab_size=vocab_size)

    return Case(model, {"": model}, run, compare).record_reference()


@pytest.fixture(scope="module")
def llama() -> Case:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).eval()
    return _greedy_case(model, torch.tensor([[1, 5, 9, 23, 42, 7, 64, 100]]), config.vocab_size)


@pytest.fixture(scope="module")
def t5() -> Case:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                      relative_attention_num_buckets=8, initializer_factor=1.5, feed_forward_proj="gated-gelu", decoder_start_token_id=0,
                      pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(config).eval()
    return _greedy_case(model, torch.tensor([[5, 9, 23, 42, 7, 64, 100, 1]]), config.vocab_size)


@pytest.fixture(scope="module")
def whisper() -> Case:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    config = WhisperConfig(vocab_size=128, num_mel_bins=16, d_model=32, encoder_layers=1, decoder_layers=1,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                           decoder_ffn_dim=64, max_source_positions=20, max_target_positions=32, init_std=0.5,
                           decoder_start_token_id=3, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                           suppress_tokens=None, begin_suppress_tokens=None)
    model = WhisperForConditionalGeneration(config).eval()
    # log-mel-like input features: (batch, mel bins, 2 * max_source_positions frames)
    features = torch.randn(1, 16, 40, generator=torch.Generator().manual_seed(1))

    def run():
        return model.generate(features, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                              return_dict_in_generate=True)

    def compare(ref, out, tier):
        return compare_generation(ref, out, tier, vocab_size=config.vocab_size)

    return Case(model, {"": model}, run, compare).record_reference()


def test_fp32_references_are_not_degenerate(llama, t5, whisper):
    # Varied tokens: a test on a model that repeats one id would not notice a broken run.
    for case in (llama, t5, whisper):
        generated = case.reference.sequences[0, -NEW_TOKENS:]
        assert len(set(generated.tolist())) >= 3, generated


@pytest.mark.parametrize(("policy", "hw"), combos(), indirect=["hw"])
def test_llama_generate(llama, policy, hw, record_property):
    check_combination(llama, policy, hw, record_property)


@pytest.mark.parametrize(("policy", "hw"), combos(), indirect=["hw"])
def test_t5_generate(t5, policy, hw, record_property):
    check_combination(t5, policy, hw, record_property)


@pytest.mark.parametrize(("policy", "hw"), combos(), indirect=["hw"])
def test_whisper_generate(whisper, policy, hw, record_property):
    check_combination(whisper, policy, hw, record_property)


@pytest.mark.parametrize(("policy", "hw"), [("fp8", "measured")], indirect=["hw"])
def test_t5_generate_guarded(t5, policy, hw, record_property):
    """fp8 weights under the guard: T5 reads ``self.wo.weight.dtype`` and casts to it."""
    check_guarded(t5, policy, hw, record_property)
