"""What explain says about a policy before it is applied: island figures and compile advice."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mixprec.casting.explain import compile_advice
from mixprec.policy import CompileSettings, Policy, Rule

BF16 = Policy((Rule("*", storage="bf16"),))


def _llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    return LlamaForCausalLM(config).eval()


def test_cuda_graphs_are_offered_for_a_token_decoder_on_cuda_and_a_compiled_one_decodes_on_a_static_cache():
    components = {"lm": _llama(), "post": torch.nn.Linear(4, 4)}
    (advice,) = compile_advice(components, BF16, "cuda")
    assert advice.startswith("lm decodes token by token (") and "reduce-overhead" in advice
    (measure,) = compile_advice(components, BF16, "cpu")
    assert "fast+compile" in measure and "CUDA" not in measure
    graphs = Policy(BF16.rules, compile=CompileSettings(mode="reduce-overhead"))
    (compiled,) = compile_advice(components, graphs, "cuda")
    assert "static key/value cache" in compiled and compiled.endswith("captured as CUDA graphs")
    (on_cpu,) = compile_advice(components, Policy(BF16.rules, compile=CompileSettings()), "cpu")
    assert "static key/value cache" in on_cpu and "CUDA" not in on_cpu
    assert compile_advice({"post": torch.nn.Linear(4, 4)}, BF16, "cuda") == []
