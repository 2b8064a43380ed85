"""Layer kinds measured faster in fp32 than in the fast 16-bit type stay fp32 under presets."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

import mixprec
from mixprec import presets
from mixprec.device.hardware import DtypeSpeed, Hardware
from mixprec.device.layers import KINDS, island_gains


def _cpu(layers):
    dtypes = {"fp32": DtypeSpeed("fp32", True, 100.0, 1.0, "fast"), "tf32": DtypeSpeed("tf32", False, 100.0, 1.0, "unsupported"),
              "bf16": DtypeSpeed("bf16", True, 280.0, 2.8, "fast"), "fp16": DtypeSpeed("fp16", True, 0.7, 0.007, "emulated")}
    return Hardware("cpu", "test CPU", None, 2**34, ("avx512_bf16",), 2, torch.__version__, dtypes, layers=layers)


MEASURED = _cpu({"bf16": {"GRU": {"gain": 3.46, "island": True}, "LSTM": {"gain": 0.9, "island": False},
                          "LayerNorm": {"gain": 1.05, "island": False}}})


class Tagger(nn.Module):
    """A recurrent tagger: embedding, a GRU, a projection."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(100, 64)
        self.rnn = nn.GRU(64, 64, batch_first=True)
        self.proj = nn.Linear(64, 10)

    def forward(self, ids):
        return self.proj(self.rnn(self.embed(ids))[0])


def test_presets_keep_measured_slow_kinds_fp32_and_say_why():
    for name in ("balanced", "fast", "memory"):
        policy, reasons = presets.resolve(name, MEASURED)
        gru = [r for r in policy.rules if r.match == "type:GRU"]
        assert len(gru) == 1 and gru[0].keep_fp32 and "GRU measured 3.46x faster in fp32 than in bf16" in gru[0].reason
        assert not [r for r in policy.rules if r.match in ("type:LSTM", "type:LayerNorm")]  # not clearly faster: no island
        assert any("GRU layers kept in fp32" in r for r in reasons)
    quality, _ = presets.resolve("quality", MEASURED)
    assert not [r for r in quality.rules if r.match.startswith("type:")]
    plain, _ = presets.resolve("fast", dataclasses.replace(MEASURED, layers={}))
    assert not [r for r in plain.rules if r.match == "type:GRU"]


def test_apply_and_explain_follow_the_measured_island():
    torch.manual_seed(0)
    model = Tagger().eval()
    ids = torch.randint(0, 100, (2, 12))
    with torch.no_grad():
        ref = model(ids)
    policy = presets.preset("fast", hardware=MEASURED)
    rows = {r["module"]: r for r in mixprec.explain({"tagger": model}, policy)}
    assert "GRU measured 3.46x faster in fp32" in str(rows["tagger.rnn"])
    with mixprec.apply({"tagger": model}, policy), torch.no_grad():
        assert model.rnn.weight_hh_l0.dtype == torch.float32 and model.proj.weight.dtype == torch.bfloat16
        out = model(ids)
    assert out.dtype == torch.float32 and torch.allclose(out, ref, atol=0.1)


def test_island_gains_measures_every_kind_it_can_run():
    gains = island_gains(torch.bfloat16, torch.device("cpu"), rounds=2, budget_s=0.05)
    assert set(gains) <= set(KINDS) and "LayerNorm" in gains
    for info in gains.values():
        assert info["gain"] > 0 and isinstance(info["island"], bool)
