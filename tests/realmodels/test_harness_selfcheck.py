"""The real-model checks catch broken runs: each broken behaviour below must fail them.

A tiny real module (no mocks) run through ``check_combination`` with a run function
that misbehaves the way a broken precision policy would.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from realmodels_harness import Case, check_combination, compare_generation, compare_waveform


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
