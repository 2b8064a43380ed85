"""The real-model checks catch broken runs: each broken behaviour below must fail them.

A tiny real module (no mocks) run through ``check_combination`` with a run function
that misbehaves the way a broken precision policy would.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch import nn

from realmodels_harness import (Case, check_combination, check_fp32_after_revert, check_pins_own_weights, compare_generation,
                                compare_waveform, output_differences, state_differences, tensor_state)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.out = nn.Linear(32, 16)

    def forward(self, x):
        return self.out(torch.relu(self.norm(self.inp(x))))


def _case(after=lambda model, y: y) -> Case:
    """A case whose fp32 reference is correct and whose later runs go through ``after``."""
    torch.manual_seed(0)
    model = Tiny().eval()
    x = torch.randn(4, 16)
    case = Case(model, {"": model}, lambda: model(x),
                lambda ref, out, tier: compare_waveform(ref, out, tier, "y")).record_reference()
    case.run = lambda: after(model, model(x))
    return case


def _noop(*args, **kwargs):
    return None


def test_a_correct_bf16_run_passes(measured_hw, record_property):
    metrics = check_combination(_case(), "bf16-native", measured_hw, record_property)
    assert 20 < metrics["y_sqnr_db"] < 80


@pytest.mark.parametrize(("after", "message"), [
    pytest.param(lambda m, y: y * float("nan"), "not finite", id="nan"),
    pytest.param(lambda m, y: torch.randn_like(y), "SQNR", id="garbage"),
    pytest.param(lambda m, y: y * 2, "SQNR", id="wrong-scale"),
    pytest.param(lambda m, y: y[:2], "shape", id="wrong-shape"),
    pytest.param(lambda m, y: y.long(), "dtype", id="int-output"),
    pytest.param(lambda m, y: y.half(), "output has", id="fp16-output-under-bf16"),
    pytest.param(lambda m, y: (m.out.register_forward_hook(_noop), y)[1], "hooks or flags left", id="hook-left"),
    pytest.param(lambda m, y: (torch.set_float32_matmul_precision("medium"), y)[1], "flags not restored", id="flag-left"),
    pytest.param(lambda m, y: (m.register_buffer("extra", torch.zeros(2)), y)[1], "tensor names changed", id="buffer-left"),
])
def test_broken_runs_fail(measured_hw, record_property, after, message):
    case = _case(after)
    with pytest.raises(AssertionError, match=message):
        check_combination(case, "bf16-native", measured_hw, record_property)
    torch.set_float32_matmul_precision("highest")


def test_quality_must_be_bit_exact(measured_hw, record_property):
    # quality is fp32 with matmul "highest": even one ulp of difference is a failure.
    case = _case(lambda m, y: y + torch.finfo(torch.float32).eps * y.abs().max())
    with pytest.raises(AssertionError, match="quality"):
        check_combination(case, "quality", measured_hw, record_property)


def test_random_logits_fail_the_token_check():
    class Gen:
        def __init__(self, logits):
            self.logits = tuple(logits)
            self.sequences = torch.stack([l.argmax(-1) for l in logits], dim=1)

    gen = torch.Generator().manual_seed(0)
    ref = Gen([torch.randn(1, 64, generator=gen) for _ in range(6)])
    close = Gen([l + 0.01 * torch.randn(1, 64, generator=gen) for l in ref.logits])
    garbage = Gen([torch.randn(1, 64, generator=gen) for _ in range(6)])
    assert compare_generation(ref, close, "16bit-compute", vocab_size=64)["logit_err_rel"] < 0.1
    with pytest.raises(AssertionError, match="logits differ"):
        compare_generation(ref, garbage, "16bit-compute", vocab_size=64)


@dataclasses.dataclass
class _Result:
    """An app's own result object (whisper's DecodingResult)."""

    tokens: list
    text: str
    logprob: float
    features: torch.Tensor


class TestOutputsComparedBitForBit:
    """``output_differences`` finds any difference in any kind of output an app returns."""

    @staticmethod
    def _outputs():
        from types import SimpleNamespace

        import numpy as np

        base = {"result": _Result([1, 2], "hi", float("nan"), torch.ones(2, 3)),
                "gen": SimpleNamespace(scores=(torch.tensor([1.0, float("-inf")]),), audio=np.zeros(3, dtype=np.float32))}
        return base

    CHANGES = {
        "token": lambda o: o["result"].tokens.__setitem__(1, 3),
        "text": lambda o: setattr(o["result"], "text", "ho"),
        "float": lambda o: setattr(o["result"], "logprob", 0.5),
        "tensor-value": lambda o: o["result"].features.__setitem__((0, 0), 1.0 + 2 ** -20),
        "tensor-dtype": lambda o: setattr(o["result"], "features", o["result"].features.double()),
        "tensor-shape": lambda o: setattr(o["result"], "features", o["result"].features[:1]),
        "inf-score": lambda o: setattr(o["gen"], "scores", (torch.tensor([1.0, float("inf")]),)),
        "numpy": lambda o: o["gen"].audio.__setitem__(2, 1e-9),
        "extra-key": lambda o: o.__setitem__("more", 1),
        "fewer-scores": lambda o: setattr(o["gen"], "scores", ()),
    }

    def test_equal_outputs_have_no_differences(self):
        a, b = self._outputs(), self._outputs()
        assert output_differences(a, b) == []  # NaN equals NaN, -inf equals -inf

    @pytest.mark.parametrize("change", sorted(CHANGES))
    def test_any_change_is_found(self, change):
        a, b = self._outputs(), self._outputs()
        self.CHANGES[change](b)
        assert output_differences(a, b), change


class TestRevertChecksForAppRuns:
    """The checks the real apps add after each combination: the first fp32 run after the
    revert equals the one before apply, and every guard pin owns weights itself."""

    def test_fp32_run_after_revert_must_equal_the_reference(self, measured_hw, record_property):
        case = _case()
        check_combination(case, "bf16-native", measured_hw, record_property)
        check_fp32_after_revert(case)
        case.run = lambda: case.reference + torch.finfo(torch.float32).eps * case.reference.abs().max()
        with pytest.raises(AssertionError, match="after revert differs"):
            check_fp32_after_revert(case)

    @pytest.mark.parametrize(("pins", "wide"), [
        (["inp", "norm"], []), ("none", []), ([""], ["(Tiny)"]),
        (["inp", "missing"], ["missing (not found)"]),
    ])
    def test_pins_that_own_no_weights_fail(self, pins, wide):
        case = _case()
        if not wide:
            assert check_pins_own_weights(case, {"guard pins": pins}) == ([] if pins == "none" else pins)
            return
        with pytest.raises(AssertionError, match="own no weights") as excinfo:
            check_pins_own_weights(case, {"guard pins": pins})
        assert all(w in str(excinfo.value) for w in wide)

    def test_pins_in_a_dict_of_components_are_found_by_component(self):
        case = _case()
        case.target = {"net": case.target}
        assert check_pins_own_weights(case, {"guard pins": ["net.out"]}) == ["net.out"]
        with pytest.raises(AssertionError, match="own no weights"):
            check_pins_own_weights(case, {"guard pins": ["net"]})

    @pytest.mark.parametrize("layout", ["coo", "csr"])
    def test_a_changed_sparse_buffer_is_a_revert_problem(self, layout):
        model = Tiny()
        dense = torch.eye(4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sparse CSR "in beta state"
            model.register_buffer("heads", dense.to_sparse() if layout == "coo" else dense.to_sparse_csr())
        before = tensor_state({"": model})
        assert state_differences(before, tensor_state({"": model})) == []
        changed = dense.clone()
        changed[0, 1] = 1.0
        model.heads = changed.to_sparse() if layout == "coo" else changed.to_sparse_csr()
        assert any("heads" in p for p in state_differences(before, tensor_state({"": model})))
        model.heads = dense
        assert any("layout" in p for p in state_differences(before, tensor_state({"": model})))
