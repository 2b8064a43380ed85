"""Weights the app changes after apply are followed (or refused before anything changes)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import mixprec
from mixprec.casting.targets import ApplyError
from mixprec.diagnose.fallbacks import FallbackStore
from mixprec.policy import Policy, Rule

from guard_models import assert_fallback_output

FP16 = Policy((Rule("*", storage="fp16"),))
BF16 = Policy((Rule("*", storage="bf16"),))


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(4, 8, bias=False)
        self.down = nn.Linear(8, 4, bias=False)

    def forward(self, x):
        return self.down(self.up(x))


def _overflowing_state() -> dict[str, torch.Tensor]:
    """``up`` reaches 8e4 on ones (inf in fp16); the output is 64,000. 20000.1 is not an fp16 value."""
    return {"up.weight": torch.full((8, 4), 20000.1), "down.weight": torch.full((4, 8), 0.1)}


def test_guard_fallback_after_load_state_dict_re_applies_the_loaded_weights(tmp_path):
    torch.manual_seed(0)
    model = TwoLayers().eval()
    x = torch.ones(1, 4)
    state = _overflowing_state()
    with torch.no_grad():
        expected = torch.nn.functional.linear(torch.nn.functional.linear(x, state["up.weight"]), state["down.weight"])
        applied = mixprec.apply(model, FP16)
        guard = mixprec.guard(applied, on_nonfinite="fallback", store=FallbackStore(tmp_path / "f.json"))
        before = guard.fingerprint
        model.load_state_dict(state)
        with pytest.warns(UserWarning, match="pinned"):
            out = model(x)
    assert float(expected.max()) == pytest.approx(64000.0, rel=1e-3)
    assert_fallback_output(out, expected, guard)
    assert guard.fingerprint != before  # remembered under the loaded weights' fingerprint
    applied.revert()
    # revert gives the loaded weights at full precision, not the ones from before the load
    assert torch.equal(model.up.weight, state["up.weight"]) and model.up.weight.dtype == torch.float32


def test_revert_after_load_state_dict_gives_the_loaded_values_bit_for_bit():
    torch.manual_seed(0)
    model = TwoLayers()
    state = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    applied = mixprec.apply(model, BF16, keep_original="disk")
    model.up.load_state_dict({"weight": state["up.weight"]})  # a submodule's own load is followed too
    model.load_state_dict({"up.weight": state["up.weight"], "down.weight": state["down.weight"]})
    assert model.up.weight.dtype == torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        applied.revert()
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_load_state_dict_with_assign_is_refused_before_anything_is_loaded():
    torch.manual_seed(0)
    model = TwoLayers()
    applied = mixprec.apply(model, BF16)
    weight = model.up.weight
    cast = weight.detach().clone()
    with pytest.raises(ApplyError, match=r"assign=True.*nothing was loaded.*revert\(\) first"):
        model.load_state_dict(_overflowing_state(), assign=True)
    assert model.up.weight is weight and torch.equal(weight, cast)
    applied.revert()


def test_a_replaced_parameter_is_the_apps_and_a_re_apply_casts_it():
    torch.manual_seed(0)
    model = TwoLayers()
    applied = mixprec.apply(model, FP16)
    new = nn.Parameter(torch.full((8, 4), 0.1234567))
    model.up.weight = new
    applied.reapply(BF16)  # as the guard's fallback does
    assert model.up.weight is new and new.dtype == torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        applied.revert()
    assert new.dtype == torch.float32 and torch.equal(new, torch.full((8, 4), 0.1234567))

    applied = mixprec.apply(model, FP16)
    other = nn.Parameter(torch.full((4, 8), 2.0))
    model.down.weight = other
    with pytest.warns(UserWarning, match=r"replaced after the policy was applied \(Linear.weight\): left as the app set them"):
        applied.revert()
    assert model.down.weight is other and torch.equal(other, torch.full((4, 8), 2.0))


def test_a_parameter_changed_in_place_is_followed_with_a_warning():
    torch.manual_seed(0)
    model = TwoLayers()
    applied = mixprec.apply(model, BF16)
    with torch.no_grad():
        model.up.weight.fill_(3.0)
    with pytest.warns(UserWarning, match=r"changed in place after the policy was applied \(Linear.weight\)"):
        applied.revert()
    assert model.up.weight.dtype == torch.float32 and torch.equal(model.up.weight, torch.full((8, 4), 3.0))


def test_torchscript_and_meta_models_are_refused_up_front():
    scripted = torch.jit.script(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)))
    state = {k: v.clone() for k, v in scripted.state_dict().items()}
    with pytest.raises(ApplyError, match=r"TorchScript module.*nothing was changed.*before torch.jit.script"):
        mixprec.apply(scripted, BF16)
    for key, value in scripted.state_dict().items():
        assert value.dtype == torch.float32 and torch.equal(value, state[key]), key

    with torch.device("meta"):
        meta = TwoLayers()
    with pytest.raises(ApplyError, match=r"meta device \(first: 'up.weight'\).*nothing was changed.*to_empty"):
        mixprec.apply(meta, BF16)
    assert all(p.dtype == torch.float32 and p.is_meta for p in meta.parameters())
    assert not meta._forward_hooks and "forward" not in meta.__dict__
    mixprec.apply(meta, Policy((Rule("*", storage="fp32"),))).revert()  # nothing to cast: nothing refused
