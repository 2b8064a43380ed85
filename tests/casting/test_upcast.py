"""Upcast attention on every path attention takes, with scores beyond fp16's range."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mixprec
from mixprec.policy import Policy, Rule

FP16 = Policy((Rule("*", storage="fp16"),))
FP16_UPCAST = Policy((Rule("*", storage="fp16"), Rule("*", upcast_attention=True)))


def _overflowing_llama():
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=32, attn_implementation="eager")
    torch.manual_seed(0)
    model = LlamaModel(cfg).eval()
    attn = model.layers[0].self_attn
    with torch.no_grad():
        attn.q_proj.weight.fill_(4.0)  # on an all-ones input: q = k = 256, scores = 16*256^2/4 ~ 2.6e5 > 65,504
        attn.k_proj.weight.fill_(4.0)
    return model


def test_transformers_eager_attention_overflows_without_upcast_and_not_with_it():
    model = _overflowing_llama()
    x = torch.ones(1, 6, 64)
    with torch.no_grad():
        ref = model(inputs_embeds=x).last_hidden_state
        with mixprec.apply(model, FP16):
            plain = model(inputs_embeds=x).last_hidden_state
        with mixprec.apply(model, FP16_UPCAST):
            upcast = model(inputs_embeds=x).last_hidden_state
    assert torch.isfinite(ref).all()
    assert torch.isnan(plain).any()
    assert torch.isfinite(upcast).all()
    assert torch.allclose(upcast.float(), ref, atol=2e-2, rtol=1e-2)


def overflowing_diffusers_attention():
    """diffusers' classic attention processor whose fp16 scores overflow on an all-ones input."""
    from diffusers.models.attention_processor import Attention, AttnProcessor

    torch.manual_seed(0)
    attn = Attention(query_dim=64, heads=4, dim_head=16, processor=AttnProcessor())
    with torch.no_grad():
        attn.to_q.weight.fill_(4.0)
        attn.to_k.weight.fill_(4.0)
    return attn


def test_diffusers_classic_attn_processor():
    attn = overflowing_diffusers_attention()
    with torch.no_grad():
        x = torch.ones(1, 6, 64)
        ref = attn(x)
        with mixprec.apply(attn, FP16):
            plain = attn(x)
        with mixprec.apply(attn, FP16_UPCAST):
            upcast = attn(x)
    assert torch.isnan(plain).any()
    assert torch.isfinite(upcast).all() and torch.allclose(upcast.float(), ref, atol=2e-2, rtol=1e-2)


class ExplicitAttention(nn.Module):
    """A user module computing q @ kᵀ by hand, optionally through SDPA."""

    def __init__(self, sdpa: bool = False):
        super().__init__()
        self.qkv = nn.Linear(32, 96, bias=False)
        self.proj = nn.Linear(32, 32)
        self.sdpa = sdpa

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if self.sdpa:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = torch.softmax(q @ k.transpose(-2, -1) / 32**0.5, dim=-1) @ v
        return self.proj(out)


@pytest.mark.parametrize("sdpa", [False, True], ids=["explicit-matmul", "sdpa"])
def test_user_module_attention(sdpa):
    torch.manual_seed(0)
    model = ExplicitAttention(sdpa)
    with torch.no_grad():
        model.qkv.weight[:64].fill_(8.0)  # q and k = 256 on ones: scores ~ 3.7e5
        x = torch.ones(2, 5, 32)
        ref = model(x)
        with mixprec.apply(model, FP16):
            plain = model(x)
        with mixprec.apply(model, FP16_UPCAST):
            upcast = model(x)
    if not sdpa:
        assert not torch.isfinite(plain).all()
    assert torch.isfinite(upcast).all()
    assert torch.allclose(upcast.float(), ref, atol=2e-2, rtol=1e-2)


def test_explain_says_when_sdpa_upcast_is_unneeded():
    from mixprec.casting.upcast import sdpa_overflows

    rows = {r["module"]: r for r in mixprec.explain(ExplicitAttention(), FP16_UPCAST)}
    assert rows["(root)"]["attention"].startswith("upcast")
    if not sdpa_overflows("cpu", torch.float16):
        assert "not needed here" in rows["(root)"]["attention"]
