"""A dtype clash is recognised by what happened, and fixed no wider than the code that reads.

Models written the way real apps write them:

* a norm subclass that runs its base in fp32 (``super().forward(x.float()).type(x.dtype)``):
  torch's CPU kernel words that clash as ``mixed dtype (CPU): expect parameter to have
  scalar type of Float``, which no list of messages had;
* torch's own ``nn.MultiheadAttention``, which hands its child ``out_proj``'s weights
  straight to ``F.multi_head_attention_forward``;
* a residual vector quantizer whose method multiplies fp32 encodings by
  ``self.codebook.weight`` itself;
* a generic module whose forward reads a child's weight with ``F.linear``.

Each runs under every preset and hand-written 16-bit policy, with apply alone and
guarded: it runs, its output stays near fp32's, the guard pins no container (only
modules that own the weights involved), and revert is bit-exact. The same holds with
torch's wording taken away from the matcher entirely.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mixprec
from mixprec import hardware
from mixprec.casting import meet
from mixprec.policy import Policy, Rule


class CastingNorm(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x.float()).type(x.dtype)


class NormBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = CastingNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class NormNet(nn.Module):
    def __init__(self, d=32, n=4):
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.blocks = nn.ModuleList(NormBlock(d) for _ in range(n))
        self.final = CastingNorm(d)
        self.head = nn.Linear(d, 8)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.final(h))


class AttentionNet(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 4, 2 * d, batch_first=True), 2)
        self.cross = nn.MultiheadAttention(d, 4, batch_first=True)
        self.head = nn.Linear(d, 8)

    def forward(self, x):
        h = self.encoder(self.inp(x))
        h, _ = self.cross(h, h, h, need_weights=False)
        return self.head(h)


class Quantizer(nn.Module):
    def __init__(self, dim, size):
        super().__init__()
        self.project = nn.Linear(dim, dim)
        self.codebook = nn.Embedding(size, dim)

    def quantize(self, x):
        encodings = self.project(x).float()
        book = self.codebook.weight
        distance = encodings.pow(2).sum(-1, keepdim=True) - 2 * encodings @ book.t() + book.pow(2).sum(-1)
        return F.embedding(distance.argmin(-1), book)

    def forward(self, x):
        quantized = self.quantize(x)
        return quantized, x - quantized.to(x.dtype)


class ResidualQuantizer(nn.Module):
    def __init__(self, dim=16, n=4, size=32):
        super().__init__()
        self.inp = nn.Linear(8, dim)
        self.layers = nn.ModuleList(Quantizer(dim, size) for _ in range(n))
        self.out = nn.Linear(dim, 8)

    def forward(self, x):
        residual, total = self.inp(x), 0
        for layer in self.layers:
            quantized, residual = layer(residual)
            total = total + quantized
        return self.out(total.to(self.out.weight.dtype))


class Reader(nn.Module):
    """A module with a parameter of its own that reads its child's weight itself."""

    def __init__(self, d=32):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(d))
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        return F.linear(x * self.scale, self.proj.weight, self.proj.bias) + x


class ReaderNet(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.readers = nn.ModuleList(Reader(d) for _ in range(3))
        self.head = nn.Linear(d, 8)

    def forward(self, x):
        h = self.inp(x)
        for reader in self.readers:
            h = reader(h)
        return self.head(h)


MODELS = {
    "norm-subclass": (NormNet, (2, 16)),
    "multihead-attention": (AttentionNet, (2, 5, 16)),
    "codebook-reader": (ResidualQuantizer, (3, 8)),
    "child-weight-reader": (ReaderNet, (2, 16)),
}

#: Hand-written policies beside the presets: 16-bit everywhere, and 16-bit storage with fp32 compute.
POLICIES = {
    "bf16": Policy(rules=(Rule("*", storage="bf16"),)),
    "fp16": Policy(rules=(Rule("*", storage="fp16"),)),
    "fp16-storage-fp32-compute": Policy(rules=(Rule("*", storage="fp16", compute="fp32"),)),
    "bf16-storage-fp32-compute": Policy(rules=(Rule("*", storage="bf16", compute="fp32"),)),
}


def _state(model):
    return {k: (v.dtype, v.clone()) for k, v in model.state_dict(keep_vars=True).items()}


def _assert_same_state(model, before):
    after = model.state_dict(keep_vars=True)
    assert set(after) == set(before)
    for key, (dtype, value) in before.items():
        assert after[key].dtype == dtype and torch.equal(after[key], value), key


def _run(model, x):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model(x)


def _check(model, x, reference, policy, guarded):
    before = _state(model)
    applied = mixprec.apply(model, policy)
    guard = mixprec.guard(applied, on_nonfinite="fallback", remember=False) if guarded else None
    try:
        out = _run(model, x)
        again = _run(model, x)  # the second call takes the path the first one settled on
        pins = dict(guard.pins) if guard else {}
    finally:
        if guard:
            guard.remove()
        applied.revert()
    _assert_same_state(model, before)
    assert torch.overrides._get_current_function_mode_stack() == []  # no scope left entered
    assert torch.equal(_run(model, x), reference)  # the first fp32 run after revert
    for output in (out, again):
        error = (output.float() - reference).abs().max().item() / reference.abs().max().item()
        assert error < 0.1, error
    modules = dict(model.named_modules())
    for name in pins:
        # No container, no enclosing block: only modules that own weights of their own.
        assert any(True for _ in modules[name].parameters(recurse=False)), (name, sorted(pins))
    return pins


def _policies(hw):
    presets = {name: mixprec.preset(name, hardware=hw) for name in ("quality", "balanced", "fast", "memory")}
    return {**presets, **POLICIES}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_policy_runs_with_pins_no_wider_than_one_module_and_reverts_exactly(name, bf16_cpu):
    cls, shape = MODELS[name]
    torch.manual_seed(0)
    model = cls().eval()
    x = torch.randn(*shape)
    reference = _run(model, x)
    hw = hardware.probe()
    for label, policy in _policies(hw).items():
        for guarded in (False, True):
            pins = _check(model, x, reference, policy, guarded)
            if name in ("multihead-attention", "child-weight-reader"):
                # The reader of a child's weights gets them widened as the child's own forward
                # would: torch's attention (and any such module) works under every policy without a pin.
                assert pins == {}, (label, guarded)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_without_any_known_wording_the_clash_is_still_recognised(name, monkeypatch):
    # No message matches: what decides is that the op failed and ran with its inputs in one dtype.
    monkeypatch.setattr(meet, "_DTYPE_MESSAGES", re.compile(r"(?!x)x"))
    cls, shape = MODELS[name]
    torch.manual_seed(0)
    model = cls().eval()
    x = torch.randn(*shape)
    reference = _run(model, x)
    for label in ("bf16", "fp16", "fp16-storage-fp32-compute"):
        for guarded in (False, True):
            _check(model, x, reference, POLICIES[label], guarded)


def test_the_guard_pins_every_module_of_the_failing_class_in_one_pass(monkeypatch):
    torch.manual_seed(0)
    model = NormNet().eval()
    x = torch.randn(2, 16)
    applied = mixprec.apply(model, POLICIES["bf16"])
    guard = mixprec.guard(applied, on_nonfinite="fallback", remember=False)
    reruns = []
    original = type(guard)._rerun
    monkeypatch.setattr(type(guard), "_rerun", lambda self, call: reruns.append(1) or original(self, call))
    with pytest.warns(UserWarning, match=r"pinned blocks\.0\.norm and the 4 other CastingNorm module\(s\)"):
        _run_warn(model, x)
    assert sorted(guard.pins) == ["blocks.0.norm", "blocks.1.norm", "blocks.2.norm", "blocks.3.norm", "final"]
    assert len(reruns) <= 3  # the probe, the one pass with the class pinned (not one per layer)
    guard.remove()
    applied.revert()


def test_the_codebook_is_pinned_not_the_quantizer():
    torch.manual_seed(0)
    model = ResidualQuantizer().eval()
    x = torch.randn(3, 8)
    for label in ("bf16", "fp16"):
        applied = mixprec.apply(model, POLICIES[label])
        guard = mixprec.guard(applied, on_nonfinite="fallback", remember=False)
        _run(model, x)
        assert sorted(guard.pins) == [f"layers.{i}.codebook" for i in range(4)], label
        guard.remove()
        applied.revert()


def _run_warn(model, x):
    with torch.no_grad():
        return model(x)


def test_the_models_own_error_is_raised_unchanged_and_widens_nothing():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x) @ torch.ones(3, 3, dtype=x.dtype)  # a shape error in any dtype

    torch.manual_seed(0)
    model = Broken().eval()
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError) as fp32_error:
        _run(model, x)
    for guarded in (False, True):
        applied = mixprec.apply(model, POLICIES["bf16"])
        guard = mixprec.guard(applied, on_nonfinite="fallback", remember=False) if guarded else None
        with pytest.raises(RuntimeError) as error:
            _run(model, x)
        assert str(error.value).splitlines()[0] == str(fp32_error.value).splitlines()[0].replace("float", "c10::BFloat16") \
            or "shapes cannot be multiplied" in str(error.value)
        if guard:
            assert guard.pins == {}
            guard.remove()
        applied.revert()


def test_the_error_names_the_op_the_models_line_and_a_rule_for_the_class():
    torch.manual_seed(0)
    model = NormNet().eval()
    applied = mixprec.apply(model, POLICIES["bf16"])
    guard = mixprec.guard(applied, on_nonfinite="raise", remember=False)
    with pytest.raises(mixprec.PrecisionDtypeError) as error:
        _run(model, torch.randn(2, 16))
    text = str(error.value)
    assert "the op torch.nn.functional.layer_norm (bfloat16 and float32)" in text
    assert f"{__file__}:" in text.split(" raised at ")[0]  # the model's own line, not torch's LayerNorm
    assert 'match = "type:CastingNorm"' in text
    guard.remove()
    applied.revert()


class NormedAttention(nn.Module):
    """An attention block (upcast scope) whose own norm fails on dtypes mid-call."""

    def __init__(self, d=32):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.norm = CastingNorm(d)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(-1, -2) / 8, dim=-1) @ v


@pytest.mark.parametrize("storage", ["bf16", "fp16"])
def test_a_fallback_in_the_middle_of_an_upcast_scope_leaves_no_mode_entered(storage):
    # The guard re-applies the policy while the failing call still runs inside the attention's
    # upcast scope: the scope must still be left, or every later op in the process upcasts.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), NormedAttention()).eval()
    x = torch.randn(2, 5, 16)
    reference = _run(model, x)
    pins = _check(model, x, reference, Policy(rules=(Rule("*", storage=storage, upcast_attention=True),)), guarded=True)
    assert sorted(pins) == ["1.norm"]
