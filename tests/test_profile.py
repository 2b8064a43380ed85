from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import mixprec
from mixprec.cli import app
from mixprec.policy import Policy, Rule
from mixprec._profile import FP16_MAX, sqnr_db

from guard_models import overflowing_lyric_encoder, tokens


def _two_layers():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [1e-6, 0.0, 0.0], [0.3, -0.7, 0.11]]))
        model[0].bias.copy_(torch.tensor([0.5, 0.0, 0.1]))
        model[1].weight.copy_(torch.tensor([[0.25, 4000.0, -1.5], [2.0, 0.0, 0.333]]))
        model[1].bias.zero_()
    return model


def _db(a, b):
    return 10 * math.log10((b.double() ** 2).sum().item() / ((a.double() - b.double()) ** 2).sum().item())


def test_numbers_match_hand_computation():
    model = _two_layers()
    x = torch.tensor([[1.0, 1.0, 1.0], [0.5, -2.0, 3.0]])
    prof = mixprec.profile(model, x, Policy((Rule("*", storage="fp16"),)))
    stats = {s.module: s for s in prof.modules}

    h = model[0](x)
    y = model[1](h)
    first, second = stats["0"], stats["1"]
    assert first.calls == 1 and second.calls == 1
    assert first.input_absmax == pytest.approx(3.0)
    assert first.output_absmax == pytest.approx(h.abs().max().item())
    assert second.input_absmax == pytest.approx(h.abs().max().item())
    assert second.output_absmax == pytest.approx(y.abs().max().item())
    assert second.fp16_headroom == pytest.approx(y.abs().max().item() / FP16_MAX)

    # h[:, 1] = 1e-6 * x0 is non-zero and below fp16's smallest normal (6.1e-5): 2 of 6 values.
    nonzero = h[h != 0].abs()
    assert first.underflow_fp16 == pytest.approx(float((nonzero < torch.finfo(torch.float16).tiny).float().mean()))
    assert first.underflow_fp16 == pytest.approx(2 / 6)
    assert first.underflow_bf16 == 0.0

    l0_16, l1_16 = [nn.Linear(3, 3).half(), nn.Linear(3, 2).half()]
    l0_16.load_state_dict({k: v.half() for k, v in model[0].state_dict().items()})
    l1_16.load_state_dict({k: v.half() for k, v in model[1].state_dict().items()})
    own0 = _db(l0_16(x.half()).float(), h)
    own1 = _db(l1_16(h.half()).float(), y)
    inherited1 = _db(l1_16(l0_16(x.half())).float(), y)
    assert first.own_sqnr_db == pytest.approx(own0, rel=1e-6)
    assert second.own_sqnr_db == pytest.approx(own1, rel=1e-6)
    assert first.inherited_sqnr_db == pytest.approx(own0, rel=1e-6)  # nothing upstream of the first layer
    assert second.inherited_sqnr_db == pytest.approx(inherited1, rel=1e-6)
    assert sqnr_db(y, y) == math.inf


def test_fp32_modules_have_no_own_error_and_weights_are_untouched():
    model = _two_layers()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    prof = mixprec.profile(model, torch.ones(1, 3), Policy((Rule("*", storage="bf16"), Rule("1", keep_fp32=True))))
    stats = {s.module: s for s in prof.modules}
    assert stats["1"].own_sqnr_db is None and stats["1"].compute == "fp32"
    assert stats["0"].own_sqnr_db is not None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_repeated_calls_are_counted():
    layer = nn.Linear(4, 4)

    class Loop(nn.Module):
        def __init__(self):
            super().__init__()
            self.step = layer

        def forward(self, x):
            for _ in range(5):
                x = torch.tanh(self.step(x))
            return x

    prof = mixprec.profile(Loop(), torch.randn(2, 4), Policy((Rule("*", storage="bf16"),)))
    assert {s.module: s.calls for s in prof.modules}["step"] == 5


def test_flags_internal_fp16_overflow_and_suggests_keep_fp32():
    prof = mixprec.profile(overflowing_lyric_encoder(), tokens(), Policy((Rule("*", storage="fp16"),)))
    worst = prof.by_risk()[0]
    assert worst.module == "blocks.2.mlp" and worst.overflows_fp16 and worst.own_nonfinite
    rules = prof.suggestions()
    assert rules[0]["match"] == "blocks.2.mlp" and rules[0]["keep_fp32"] is True
    policy = Policy.from_toml(prof.suggestions_toml())  # the suggestion is a pasteable policy
    assert policy.rules[0].match == "blocks.2.mlp"
    assert json.loads(prof.to_json())["modules"][0]["module"] == "blocks.2.mlp"


def test_diagnose_cli(tmp_path):
    import sqlite3

    db = tmp_path / "d.sqlite"
    result = CliRunner().invoke(app, ["diagnose", "--pipeline", "tts", "--size", "test", "--preset", "memory", "--json",
                                      "--save", "--db", str(db)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["policy"]["name"] == "memory"
    modules = {m["module"] for m in data["modules"]}
    assert "t3.lm_head" in modules and "vocoder.conv_post" in modules
    assert all(m["calls"] >= 1 for m in data["modules"])
    with sqlite3.connect(db) as con:
        stored = con.execute("SELECT COUNT(*) FROM profile_rows WHERE config='memory'").fetchone()[0]
    assert stored == len(data["modules"])
