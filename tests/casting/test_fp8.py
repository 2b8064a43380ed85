"""fp8 weight storage: exact dequantisation, what goes to fp8, bit-exact revert, weights model code reads."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import mixprec
from mixprec import Policy, Rule
from mixprec.casting.fp8 import Fp8Weight, dequantise, quantise
from mixprec.casting.fp32compute import Fp8InputWarning

FP8 = Policy(rules=(Rule("*", storage="fp8"),))


@pytest.mark.parametrize("fmt", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_every_code_dequantises_as_the_fp32_product_rounded_once(fmt, dtype):
    codes = torch.arange(256, dtype=torch.uint8).view(fmt)
    codes = codes[torch.isfinite(codes.float())].reshape(-1, 1).repeat(1, 3)
    for scale in (2.0 ** -7, 0.01171875, 3.0):  # bf16 numbers, as quantise makes them
        entry = Fp8Weight(torch.full((codes.shape[0], 1), scale), fmt)
        expected = (codes.float() * scale).to(dtype)
        assert torch.equal(dequantise(codes, entry, dtype), expected), (fmt, dtype, scale)


def test_scales_are_bf16_numbers_and_no_row_passes_the_formats_largest_value():
    torch.manual_seed(0)
    w = torch.randn(33, 17) * torch.logspace(-4, 3, 33).unsqueeze(1)
    w[5] = 0
    values, scale = quantise(w, torch.float8_e4m3fn)
    assert values.dtype == torch.float8_e4m3fn and scale.shape == (33, 1)
    assert torch.equal(scale.to(torch.bfloat16).float(), scale)  # exactly representable in bf16
    assert scale[5].item() == 1.0 and values[5].float().abs().max().item() == 0
    assert (w.abs() / scale).max().item() <= 448.0  # rounded up: nothing clamped
    err = ((values.float() * scale - w).abs() / w.abs().amax(1, keepdim=True).clamp_min(1e-30)).max().item()
    assert err <= 2 ** -4  # half an ulp of 3 mantissa bits, relative to the row's largest value
    assert quantise(torch.tensor([[1.0, float("inf")]] * 4), torch.float8_e4m3fn) is None


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm0 = nn.LayerNorm(32)  # the first weight (what an app's next(model.parameters()).dtype reads)
        self.embed = nn.Embedding(50, 32)
        self.proj = nn.Linear(32, 64)
        self.conv = nn.Conv1d(64, 64, 3, padding=1)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 8)

    def forward(self, ids):
        h = self.proj(self.norm0(self.embed(ids)))
        h = self.conv(h.transpose(1, 2)).transpose(1, 2)
        return self.head(self.norm(torch.relu(h)))


def _state(model):
    return {k: (v, v.dtype, v.clone()) for k, v in model.state_dict(keep_vars=True).items()}


def _same(model, before):
    after = model.state_dict(keep_vars=True)
    return set(after) == set(before) and all(after[k] is t and after[k].dtype == d and torch.equal(after[k], v)
                                             for k, (t, d, v) in before.items())


def test_fp8_stores_layer_weights_in_8_bits_the_rest_in_bf16_and_reverts_bit_exactly():
    torch.manual_seed(0)
    model = Net().eval()
    ids = torch.randint(0, 50, (3, 11))
    reference = model(ids)
    before = _state(model)
    fp32_bytes = mixprec.weight_bytes(model)
    with torch.no_grad(), mixprec.apply(model, FP8) as applied:
        dtypes = {k: v.dtype for k, v in model.state_dict().items()}
        out = model(ids)
        rows = {r["module"]: r["storage"] for r in applied.explain()}
        bytes_fp8 = applied.weight_bytes()
    assert {k for k, d in dtypes.items() if d == torch.float8_e4m3fn} == {"embed.weight", "proj.weight", "conv.weight", "head.weight"}
    assert {d for k, d in dtypes.items() if not k.endswith(".weight") or "norm" in k} == {torch.bfloat16}
    assert rows["proj"] == "fp8" and rows["norm"] == "bf16"
    # a byte per weight value, 2 per bias / norm value, 4 per scale (one per output row)
    scales = 4 * (50 + 64 + 64 + 8)
    assert bytes_fp8 == (50 * 32 + 32 * 64 + 64 * 64 * 3 + 64 * 8) + 2 * (32 + 32 + 64 + 64 + 64 + 64 + 8) + scales
    assert bytes_fp8 < 0.3 * fp32_bytes
    cos = torch.nn.functional.cosine_similarity(out.float().flatten(), reference.flatten(), dim=0).item()
    assert cos > 0.99
    assert _same(model, before)
    assert torch.equal(model(ids), reference)


def test_half_after_apply_keeps_the_fp8_weights_and_revert_still_puts_everything_back():
    torch.manual_seed(0)
    model = Net().eval()
    ids = torch.randint(0, 50, (2, 5))
    before = _state(model)
    applied = mixprec.apply(model, FP8)
    with torch.no_grad():
        first = model(ids)
        model.half()  # the app converts its model: fp8 weights have no fp16 meaning without their scales
        assert model.proj.weight.dtype == torch.float8_e4m3fn and model.proj.bias.dtype == torch.float16
        second = model(ids)
    assert torch.nn.functional.cosine_similarity(first.float().flatten(), second.float().flatten(), dim=0).item() > 0.999
    applied.revert()
    assert _same(model, before)


def test_weights_loaded_after_apply_are_stored_anew_and_become_the_originals():
    torch.manual_seed(0)
    model, other = Net().eval(), Net().eval()
    ids = torch.randint(0, 50, (2, 7))
    applied = mixprec.apply(model, FP8)
    model.load_state_dict(other.state_dict())
    with torch.no_grad():
        loaded = model(ids)
        with mixprec.apply(other, FP8):
            fresh = other(ids)
    assert torch.equal(loaded, fresh)  # the same fp8 values and scales as an apply on those weights
    applied.revert()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))


def test_a_tied_embedding_and_head_stay_one_fp8_tensor():
    torch.manual_seed(0)
    model = Net().eval()
    model.head = nn.Linear(32, 50, bias=False)
    model.norm = nn.Identity()
    model.conv = nn.Identity()
    model.proj = nn.Identity()
    model.head.weight = model.embed.weight
    ids = torch.randint(0, 50, (2, 4))
    before = _state(model)
    with torch.no_grad(), mixprec.apply(model, FP8):
        assert model.head.weight is model.embed.weight and model.head.weight.dtype == torch.float8_e4m3fn
        model(ids)
    assert _same(model, before) and model.head.weight is model.embed.weight


class Reader(nn.Module):
    """Code that reads its children's weights itself (T5 and Whisper do both)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.tokens = nn.Embedding(40, 16)
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, ids):
        h = self.up(self.norm(self.tokens(ids)))
        if h.shape[-1] == self.down.weight.shape[1]:  # a shape read leaves the weight to fp8
            h = h.to(self.down.weight.dtype)
        return self.down(h) @ self.tokens.weight.to(h.dtype).t()


def test_weights_that_model_code_reads_stay_in_the_compute_dtype_and_explain_says_why():
    torch.manual_seed(0)
    model = Reader().eval()
    ids = torch.randint(0, 40, (2, 6))
    reference = model(ids)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", Fp8InputWarning)
        with mixprec.apply(model, FP8) as applied:
            dtypes = {k: v.dtype for k, v in model.state_dict().items() if k.endswith("weight")}
            out = model(ids)
            reasons = {r["module"]: r["reason"] for r in applied.explain()}
    assert dtypes == {"norm.weight": torch.bfloat16, "tokens.weight": torch.bfloat16, "up.weight": torch.float8_e4m3fn,
                      "down.weight": torch.bfloat16}
    assert "Reader reads self.tokens.weight" in reasons["tokens"] and "self.down.weight" in reasons["down"]
    assert torch.nn.functional.cosine_similarity(out.float().flatten(), reference.flatten(), dim=0).item() > 0.99


def test_a_caller_without_source_that_casts_to_the_fp8_dtype_is_told_once():
    namespace: dict = {}
    exec("def forward(self, x):\n    return self.inner(x.to(self.inner.weight.dtype))\n", namespace)  # no source file
    Caster = type("Caster", (nn.Module,), {"forward": namespace["forward"]})
    model = Caster()
    model.first = nn.LayerNorm(8)  # the component's first weight stays 16-bit: its own reader is the one unseen
    model.inner = nn.Linear(8, 8)
    with torch.no_grad(), mixprec.apply(model, FP8), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(torch.randn(2, 8))
        model(torch.randn(2, 8))
    told = [w for w in caught if issubclass(w.category, Fp8InputWarning)]
    assert len(told) == 1 and "Linear stored in fp8 was called with an fp8 input" in str(told[0].message)


def test_compute_can_be_named_for_fp8_storage():
    torch.manual_seed(0)
    model = Net().eval()
    ids = torch.randint(0, 50, (2, 5))
    policy = Policy(rules=(Rule("*", storage="fp8", compute="fp32"),))
    with torch.no_grad(), mixprec.apply(model, policy) as applied:
        assert model.proj.weight.dtype == torch.float8_e4m3fn and model.proj.bias.dtype == torch.float32
        assert model(ids).dtype == torch.float32
        assert {r["compute"] for r in applied.explain()} == {"fp32"}


def _dtype_of(module: nn.Module) -> torch.dtype:
    return next(p.dtype for p in module.parameters() if p.is_floating_point())


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        x = self.a(x.to(next(self.parameters()).dtype))
        return self.c(self.b(x.to(_dtype_of(self.b))))


def test_first_weights_read_through_parameters_or_a_dtype_helper_stay_out_of_fp8():
    torch.manual_seed(0)
    model = nn.Sequential(nn.LayerNorm(16), Block(), Block())
    with torch.no_grad(), mixprec.apply(model, FP8), warnings.catch_warnings():
        warnings.simplefilter("error", Fp8InputWarning)
        model(torch.randn(3, 16))
        stored = {k: v.dtype for k, v in model.state_dict().items() if k.endswith("weight")}
    assert stored == {"0.weight": torch.bfloat16, **{f"{i}.{n}.weight": torch.bfloat16 for i in (1, 2) for n in "ab"},
                      "1.c.weight": torch.float8_e4m3fn, "2.c.weight": torch.float8_e4m3fn}


def test_a_rule_naming_a_read_weight_stores_it_in_fp8_anyway():
    torch.manual_seed(0)
    model = Reader().eval()
    insist = Policy(rules=(Rule("*", storage="fp8"), Rule("tokens", storage="fp8"), Rule("dow?", storage="fp8")))
    with torch.no_grad(), mixprec.apply(model, insist) as applied:
        # named literally: the user's call; a glob that happens to match is not
        assert model.tokens.weight.dtype == torch.float8_e4m3fn and model.down.weight.dtype == torch.bfloat16
        assert "kept in" not in {r["module"]: r["reason"] for r in applied.explain()}["tokens"]
