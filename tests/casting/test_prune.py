"""Per-module casts come off where the first calls show they never change a dtype."""

from __future__ import annotations

import os
import sys
import warnings

import torch
from torch import nn

import mixprec
from mixprec.casting import hooks
from mixprec.casting.prune import LEARN_CALLS
from mixprec.policy import Policy, Rule

BF16 = Policy((Rule("*", storage="bf16"),))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, h, raw=False):
        if raw:  # a path the first calls never take: an fp32 tensor made here meets a 16-bit layer
            h = torch.ones(h.shape, dtype=torch.float32)
        return self.norm(self.proj(h))


class Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.phase = nn.Linear(4, 8)

    def forward(self, h, raw=False):
        for block in self.blocks:
            h = block(h, raw=raw)
        # made in fp32 inside the forward on every call: this layer's cast is needed
        return h + self.phase(torch.sin(torch.arange(4.0)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.body = Body()

    def forward(self, x, raw=False):
        return self.body(self.inp(x), raw=raw)


def _net():
    torch.manual_seed(0)
    return Net().eval()


def _wrapped(module: nn.Module) -> bool:
    return "forward" in module.__dict__


def _mixprec_wrapper_calls(fn) -> int:
    here = os.path.dirname(hooks.__file__)
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call" and frame.f_code.co_name.startswith("mixprec_") and frame.f_code.co_filename.startswith(here):
            count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def test_casts_that_never_cast_come_off_and_needed_ones_stay():
    model, x = _net(), torch.randn(2, 8)
    with torch.no_grad(), mixprec.apply(model, BF16):
        assert _wrapped(model.body.blocks[0].proj) and _wrapped(model.body.blocks[0])  # until a call shows what they do
        outputs = []
        calls_while_learning = _mixprec_wrapper_calls(lambda: outputs.append(model(x)))
        first = outputs[0]
        for _ in range(LEARN_CALLS):
            model(x)
        # Inside the bf16 region nothing casts: the blocks and their layers run as the model's own code.
        assert not _wrapped(model.body.blocks[0].proj) and not _wrapped(model.body.blocks[1].norm) and not _wrapped(model.body.blocks[0])
        # The layer fed an fp32 tensor made inside the forward keeps its cast; the component's
        # direct children keep their entries (the app may call them from outside any call).
        assert _wrapped(model.body.phase) and _wrapped(model.body)
        pruned_calls = _mixprec_wrapper_calls(lambda: model(x))
        assert pruned_calls < calls_while_learning
        assert torch.equal(model(x), first)  # the same result without the wrappers


def test_a_path_the_first_calls_never_took_puts_every_cast_back():
    model, x = _net(), torch.randn(2, 8)
    with torch.no_grad(), mixprec.apply(model, BF16), warnings.catch_warnings():
        warnings.simplefilter("error")  # put back silently: nothing widened, nothing re-run by the dtype rule
        for _ in range(LEARN_CALLS):
            model(x)
        assert not _wrapped(model.body.blocks[0].proj)
        out = model(x, raw=True)  # proj meets an fp32 tensor: its cast is needed after all
        assert out.dtype == torch.float32 and torch.isfinite(out).all()
        assert _wrapped(model.body.blocks[0].proj) and _wrapped(model.body.blocks[1].proj)
        for _ in range(LEARN_CALLS):
            model(x)
        assert _wrapped(model.body.blocks[0].proj)  # no more pruning in this component
    with torch.no_grad():
        reference = mixprec.apply(model, BF16)
        try:
            assert torch.equal(model(x, raw=True), out)  # what the never-pruned model computes
        finally:
            reference.revert()


def test_revert_after_pruning_is_bit_exact_and_leaves_no_wrapper():
    model, x = _net(), torch.randn(2, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        fp32 = model(x)
        with mixprec.apply(model, BF16):
            for _ in range(LEARN_CALLS + 1):
                model(x)
        assert not any(_wrapped(m) for m in model.modules())
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
        assert torch.equal(model(x), fp32)
