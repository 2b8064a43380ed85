"""A Ctrl-C while mixprec changes a model or torch's settings: the change is made whole or not at all.

The interrupt is a real SIGINT to this process, sent from inside the change (the second weight
swapped, the second flag written); Python raises it at the next bytecode, as it would a Ctrl-C.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch
from torch import nn

import mixprec
from mixprec._signals import held_interrupt
from mixprec.casting import apply as apply_module
from mixprec.device import backends
from mixprec.policy import Policy, Rule

pytestmark = pytest.mark.skipif(not hasattr(signal, "pthread_sigmask"), reason="POSIX signals")

ALL_BF16 = Policy((Rule("*", storage="bf16", compute="bf16"),), name="all-bf16")


@pytest.fixture(autouse=True)
def _ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt here, as in a terminal (a test runner may handle it otherwise)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupt_on(module, name, monkeypatch, call=2):
    """Send SIGINT to this process on the ``call``-th call of ``module.name``."""
    real, calls = getattr(module, name), []

    def interrupting(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, interrupting)
    return calls


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8), nn.Linear(8, 4))


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    now = model.state_dict()
    return all(now[k].dtype == v.dtype and torch.equal(now[k], v) for k, v in before.items())


def test_ctrl_c_while_apply_swaps_the_weights_leaves_the_model_as_it_was(monkeypatch):
    model, x = _model(), torch.randn(2, 8)
    before, out = _state(model), model(x)
    calls = _interrupt_on(apply_module, "set_data", monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        mixprec.apply(model, ALL_BF16)
    assert len(calls) > 2  # the swap went on to its end, then was undone whole
    assert _same(model, before) and torch.equal(model(x), out)
    assert all(not m._forward_hooks and not m._forward_pre_hooks and "forward" not in m.__dict__ for m in model.modules())
    monkeypatch.undo()
    with mixprec.apply(model, ALL_BF16):  # and it applies again, as a model never touched does
        assert model[0].weight.dtype == torch.bfloat16


def test_ctrl_c_while_revert_puts_the_weights_back_still_reverts_whole(monkeypatch):
    model, x = _model(), torch.randn(2, 8)
    before, out = _state(model), model(x)
    applied = mixprec.apply(model, ALL_BF16)
    calls = _interrupt_on(apply_module, "set_data", monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        applied.revert()
    assert len(calls) == len(before)  # every weight put back before the interrupt was raised
    assert _same(model, before) and torch.equal(model(x), out)
    with pytest.raises(mixprec.RevertError, match="already reverted"):
        applied.revert()


def test_ctrl_c_while_the_numeric_settings_are_written_leaves_them_as_they_were(monkeypatch):
    before = backends.snapshot()
    owners = list(backends._owners(None))
    _interrupt_on(backends, "_write_reduction", monkeypatch, call=1)
    with pytest.raises(KeyboardInterrupt):
        mixprec.apply_numerics(mixprec.NumericSettings(matmul="medium", bf16_reduced_precision_reduction=False))
    assert backends.snapshot() == before and list(backends._owners(None)) == owners
    monkeypatch.undo()
    _interrupt_on(backends, "_write_reduction", monkeypatch, call=1)
    with pytest.raises(KeyboardInterrupt):
        with mixprec.numerics(matmul="high", bf16_reduced_precision_reduction=False):
            pytest.fail("the block runs only once the settings are written")  # pragma: no cover
    assert backends.snapshot() == before and list(backends._owners(None)) == owners


def test_held_interrupt_raises_once_the_block_ended_and_puts_the_handler_back():
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with held_interrupt():
            os.kill(os.getpid(), signal.SIGINT)
            reached.append(sum(range(1000)))  # bytecodes run after the signal: it is held
            with held_interrupt():  # nested: the outer one raises it
                reached.append(1)
    assert reached == [499500, 1] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with held_interrupt():  # without an interrupt nothing is raised
        reached.append(2)
    assert reached[-1] == 2
