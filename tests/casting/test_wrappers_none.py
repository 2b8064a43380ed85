"""``Policy(wrappers="none")``: the one-line cast ``model.to(dtype)``, reverted bit-exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mixprec
from mixprec.policy import Policy, PolicyError, Rule


def _forward_wrapped(model):
    """Modules with a forward (pre-)hook or a patched method: what a call pays for."""
    return [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks or "forward" in m.__dict__]


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))


def test_a_uniform_plan_installs_nothing_and_runs_as_model_to_dtype():
    model, x = _model(), torch.randn(2, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    naive = Policy((Rule("*", storage="bf16"),), wrappers="none")
    with mixprec.apply(model, naive):
        assert _forward_wrapped(model) == [] and model[0].weight.dtype == torch.bfloat16
        with pytest.raises(RuntimeError, match="same dtype"):  # no entry cast, as after model.to(bfloat16)
            model(x)
        expected = _model().to(torch.bfloat16)(x.to(torch.bfloat16))
        assert torch.equal(model(x.to(torch.bfloat16)), expected)
    assert all(torch.equal(before[k], v) and before[k].dtype == v.dtype for k, v in model.state_dict().items())
    with mixprec.apply(model, Policy((Rule("*", storage="bf16"),))):  # auto: the entry casts inputs
        assert _forward_wrapped(model) and model(x).dtype == torch.float32


def test_a_mixed_plan_gets_its_wrappers_whatever_it_asks():
    model, x = _model(), torch.randn(2, 8)
    mixed = Policy((Rule("*", storage="bf16"), Rule("2", keep_fp32=True)), wrappers="none")
    with mixprec.apply(model, mixed):
        assert _forward_wrapped(model) and model[2].weight.dtype == torch.float32
        assert torch.isfinite(model(x)).all()


def test_wrappers_round_trip_and_a_bad_value_is_refused():
    policy = Policy((Rule("*", storage="fp16"),), wrappers="none")
    assert Policy.from_dict(policy.to_dict()) == policy and policy.to_dict()["wrappers"] == "none"
    assert "wrappers" not in Policy(()).to_dict()
    with pytest.raises(PolicyError, match="policy wrappers: 'some'; choose one of: auto, none"):
        Policy((), wrappers="some")
    with pytest.raises(PolicyError, match="key 'wrappers'"):
        Policy.from_dict({"version": 1, "wrappers": 3, "rules": []})
