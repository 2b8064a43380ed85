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
from mixprec.diagnose.profile import sqnr_db
from mixprec.diagnose.profile_result import FP16_MAX

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


# --- pairing of the fp32 run and the policy run -----------------------------------------

BF16_FP32 = Policy((Rule("*", storage="bf16", compute="fp32"),))


class _Noisy(nn.Module):
    """Noise drawn inside forward, as flow-matching decoders and NSF vocoders do."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.noisy = _NoisyLinear()
        self.b = nn.Linear(16, 16)

    def forward(self, x):
        h = self.a(x)
        h = h + torch.randn_like(h)
        return self.b(self.noisy(h))


class _NoisyLinear(nn.Module):
    """Owns weights and draws noise itself: its own-error copy must draw the same noise."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x):
        return x @ self.weight + torch.rand_like(x)


@pytest.mark.parametrize("policy", [BF16_FP32, Policy((Rule("*", storage="bf16"),))], ids=["bf16-fp32", "bf16"])
def test_random_draws_inside_the_run_are_paired(policy):
    torch.manual_seed(0)
    model = _Noisy()
    x = torch.randn(8, 16)
    torch.manual_seed(123)
    before = torch.get_rng_state()
    prof = mixprec.profile(model, x, policy)
    stats = {s.module: s for s in prof.modules}
    # bf16 rounding gives about 50 dB; noise against other noise gives about 0 dB.
    for name in ("noisy", "b", "(root)"):
        assert stats[name].inherited_sqnr_db > 35, (name, stats[name].inherited_sqnr_db)
        assert stats[name].pairing_mismatch is None
    assert stats["noisy"].own_sqnr_db > 35
    assert torch.equal(torch.get_rng_state(), before)  # the caller's random state is untouched
    assert prof.output_sqnr_db == pytest.approx(stats["(root)"].inherited_sqnr_db)


def test_random_draws_in_16_bits_are_the_fp32_draws_rounded():
    # What torch 2.13 gives on its own; torch 2.6's CPU kernels draw other values in 16 bits.
    from mixprec.diagnose.profile import _WideDraws

    draws = {
        "randn": lambda dtype: torch.randn(4, 8, dtype=dtype),
        "rand": lambda dtype: torch.rand(4, 8, dtype=dtype),
        "randn_like": lambda dtype: torch.randn_like(torch.zeros(4, 8, dtype=dtype)),
        "rand_like": lambda dtype: torch.rand_like(torch.zeros(4, 8, dtype=dtype)),
        "normal": lambda dtype: torch.normal(torch.zeros(4, 8, dtype=dtype), 1.0),
        "normal(size, dtype)": lambda dtype: torch.normal(0.0, 1.0, (4, 8), dtype=dtype),
        "bernoulli": lambda dtype: torch.bernoulli(torch.full((4, 8), 0.5, dtype=dtype)),
        "Tensor.normal_": lambda dtype: torch.empty(4, 8, dtype=dtype).normal_(),
        "Tensor.uniform_": lambda dtype: torch.empty(4, 8, dtype=dtype).uniform_(-1, 1),
    }
    for name, draw in draws.items():
        for dtype in (torch.float16, torch.bfloat16):
            torch.manual_seed(0)
            expected = draw(torch.float32).to(dtype)
            torch.manual_seed(0)
            with _WideDraws():
                got = draw(dtype)
            assert got.dtype == dtype and torch.equal(got, expected), (name, dtype)


def test_run_that_draws_its_own_inputs_is_paired():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    # A run that does not reseed: each call draws other inputs from the global generator.
    prof = mixprec.profile({"m": model}, None, BF16_FP32, run=lambda _: model(torch.randn(4, 16)))
    assert min(s.inherited_sqnr_db for s in prof.modules) > 35


def test_fp32_compute_from_bf16_weights_has_own_error():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
    x = torch.randn(5, 32)
    prof = mixprec.profile(model, x, BF16_FP32)
    stats = {s.module: s for s in prof.modules}
    h = model[1](model[0](x))
    y = model[2](h)
    rounded = lambda layer, v: torch.nn.functional.linear(v, layer.weight.bfloat16().float(), layer.bias.bfloat16().float())
    assert stats["0"].compute == "fp32" and stats["0"].storage == "bf16"
    assert stats["0"].own_sqnr_db == pytest.approx(_db(rounded(model[0], x), model[0](x)), rel=1e-6)
    assert stats["2"].own_sqnr_db == pytest.approx(_db(rounded(model[2], h), y), rel=1e-6)
    assert math.isfinite(stats["2"].own_sqnr_db) and 30 < stats["2"].own_sqnr_db < 80
    assert stats["1"].own_sqnr_db is None  # no weights of its own
    # inherited: the policy run with fp32 arithmetic on rounded weights, end to end
    assert stats["2"].inherited_sqnr_db == pytest.approx(_db(rounded(model[2], model[1](rounded(model[0], x))), y), rel=1e-5)


class _DtypeLoop(nn.Module):
    """Its loop count and slice width depend on the weights' dtype, as data-dependent loops do."""

    def __init__(self):
        super().__init__()
        self.step = nn.Linear(8, 8)
        self.head = nn.Linear(8, 8)
        self.tail = nn.Linear(8, 8)

    def forward(self, x):
        fp32 = self.step.weight.dtype == torch.float32
        for _ in range(3 if fp32 else 2):
            x = torch.tanh(self.step(x))
        x = self.head(x)
        return self.tail(x[: 4 if fp32 else 3])


def test_modules_called_a_different_number_of_times_are_flagged_not_paired():
    torch.manual_seed(0)
    prof = mixprec.profile(_DtypeLoop(), torch.randn(4, 8), Policy((Rule("*", storage="bf16"),)))
    stats = {s.module: s for s in prof.modules}
    step, head, tail = stats["step"], stats["head"], stats["tail"]
    assert (step.calls, step.policy_calls) == (3, 2)
    assert step.pairing_mismatch == "called 3 times in fp32, 2 under the policy"
    assert step.inherited_sqnr_db is None and step.own_sqnr_db is not None  # own error needs no pairing
    assert (tail.calls, tail.policy_calls) == (1, 1)
    assert "shape (4, 8) in fp32, shape (3, 8) under the policy" in tail.pairing_mismatch
    assert tail.inherited_sqnr_db is None
    assert head.pairing_mismatch is None and head.inherited_sqnr_db is not None
    assert json.loads(prof.to_json())["modules"]  # the new fields serialise


class _InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 16))

    def forward(self, x):
        y = x @ self.weight
        x.mul_(3.0)  # changes its input in place after using it
        return y


class _CastsInputs(nn.Module):
    """Casts the caller's inputs in place to its weights' dtype, token ids included (as Chatterbox's S3Gen does)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(2048, 16)
        self.inner = _InPlace()

    def forward(self, inputs):
        for key in list(inputs):
            inputs[key] = inputs[key].to(self.emb.weight.dtype)
        return self.inner(self.emb(inputs["tokens"].long()) + inputs["x"])


def test_inputs_changed_in_place_do_not_leak_into_the_profile_or_the_caller():
    torch.manual_seed(0)
    model = _CastsInputs()
    inputs = {"tokens": torch.tensor([[1, 700, 1201, 1999]]), "x": torch.randn(1, 4, 16)}
    original = {k: v.clone() for k, v in inputs.items()}
    prof = mixprec.profile(model, inputs, BF16_FP32)
    assert all(torch.equal(inputs[k], original[k]) and inputs[k].dtype == original[k].dtype for k in inputs)
    stats = {s.module: s for s in prof.modules}
    with torch.no_grad():
        expected_in = model.emb(original["tokens"]) + original["x"]
    assert stats["inner"].input_absmax == pytest.approx(expected_in.abs().max().item())  # before the forward's x.mul_
    assert stats["inner"].own_sqnr_db > 35
    # bf16 storage rounds the token ids 700 -> 702, 1201 -> 1200, 1999 -> 2000 in the model's own cast: real, but
    # not arithmetic error, and said so
    assert stats["emb"].int_inputs_differ and not stats["inner"].int_inputs_differ


def test_int_inputs_that_match_are_not_flagged():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 8))
    prof = mixprec.profile(model, torch.tensor([[1, 2, 49]]), BF16_FP32)
    assert not any(s.int_inputs_differ or s.pairing_mismatch for s in prof.modules)


def test_a_non_finite_input_is_the_inputs_not_an_overflow_inside_a_module():
    model = _two_layers()
    x = torch.randn(2, 3)
    x[1, 2] = math.nan
    with pytest.raises(mixprec.NonFiniteInputError, match=r"non-finite values in the profiled inputs, at \[1\]\['x'\]"):
        mixprec.profile(model, (torch.ones(2, 3), {"x": x}), Policy((Rule("*", storage="fp16"),)),
                        run=lambda inputs: model(inputs[1]["x"]))


class _LogThenLinear(nn.Module):
    """Its own fp32 code makes NaN from a negative input (log), before a plain layer."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(torch.log(x))


def test_a_module_whose_input_turned_non_finite_is_marked_and_never_suggested():
    torch.manual_seed(0)
    model = _LogThenLinear()
    x = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])  # one negative value: NaN in fp32 already
    prof = mixprec.profile(model, x, Policy((Rule("*", storage="fp16"),)))
    stats = {s.module: s for s in prof.modules}
    assert stats["lin"].input_nonfinite and not stats["lin"].overflows_fp16
    assert not stats["(root)"].input_nonfinite
    assert not any("overflow inside the module" in s["reason"] or s["match"] == "lin" for s in prof.suggestions())
    assert next(r for r in prof.rows() if r["module"] == "lin")["input_nonfinite"] is True  # reported in the rows
