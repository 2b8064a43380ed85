"""Regressions from trying mixprec as a hostile user would: bad inputs, nested applies, bare modules."""

from __future__ import annotations

import math

import pytest
import torch

import mixprec
from mixprec._guard import FallbackStore
from mixprec.policy import Policy, Rule

from guard_models import overflowing_lyric_encoder, tokens

FP16 = Policy((Rule("*", storage="fp16"),))


class Overflowing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(4, 8)
        self.down = torch.nn.Linear(8, 4)
        with torch.no_grad():
            self.up.weight.fill_(2e4)  # 8e4 in fp16: inf

    def forward(self, x):
        return self.down(torch.relu(self.up(x)) * 1e-3)


@pytest.fixture
def store(tmp_path):
    return FallbackStore(tmp_path / "fallbacks.json")


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("mode", ["raise", "fallback"])
def test_nonfinite_input_is_blamed_not_a_module(store, bad, mode):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    applied = mixprec.apply({"m": model}, FP16)
    guard = mixprec.guard(applied, on_nonfinite=mode, store=store)
    x = torch.randn(2, 4)
    x[0, 1] = bad
    with pytest.raises(mixprec.NonFiniteInputError, match=r"component 'm' was called with non-finite values in argument 0"):
        with torch.no_grad():
            model(x)
    assert guard.pins == {} and store.load() == {}
    assert applied.policy.rules == FP16.rules and model[0].weight.dtype == torch.float16
    applied.revert()


def test_fallback_works_on_a_bare_module(store):
    model = Overflowing()
    x = torch.ones(2, 4)
    with torch.no_grad():
        expected = model(x)
    applied = mixprec.apply(model, FP16)
    guard = mixprec.guard(applied, on_nonfinite="fallback", store=store)
    with pytest.warns(UserWarning, match="pinned"), torch.no_grad():
        out = model(x)
    assert torch.isfinite(out).all() and torch.allclose(out, expected, rtol=1e-2, atol=1e-2)
    assert guard.pins
    applied.revert()
    assert model.up.weight.dtype == torch.float32


def test_a_policy_on_part_of_an_applied_model_is_refused():
    model = overflowing_lyric_encoder()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    applied = mixprec.apply(model, Policy((Rule("*", storage="bf16"),)))
    with pytest.raises(mixprec.ApplyError, match="already has a mixprec policy applied to it or to a part of it"):
        mixprec.apply(model.blocks[0].norm, FP16)
    applied.revert()
    part = mixprec.apply(model.blocks[0].norm, FP16)
    with pytest.raises(mixprec.ApplyError, match="already has a mixprec policy applied"):
        mixprec.apply(model, FP16)  # contains an applied part
    part.revert()
    after = model.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
    with torch.no_grad():
        model(tokens())


def test_gradio_analytics_are_off_unless_asked_for(monkeypatch):
    pytest.importorskip("gradio")
    from mixprec.ui.app import build_app

    monkeypatch.delenv("GRADIO_ANALYTICS_ENABLED", raising=False)
    assert build_app("en").analytics_enabled is False
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "True")
    assert build_app("en").analytics_enabled is True
