"""A tiny seeded transformers Llama (hidden 32, 2 layers) shared by the tests of models other
libraries hand over (accelerate offload, peft, tied embeddings)."""

from __future__ import annotations


def tiny_llama(*, tied: bool = False):
    """``LlamaForCausalLM`` in eval mode, seeded; ``tied``: the head shares the embedding."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=tied)
    return LlamaForCausalLM(config).eval()
