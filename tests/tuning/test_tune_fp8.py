"""The memory objective's fp8 step: fp8 weights where the bound holds, measured 16-bit exceptions."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import mixprec
from mixprec.tuning.evaluators import InProcessEvaluator
from mixprec.tuning.tuner import tune

WIDTH = 32
OUTLIERS = ("3.3", "6.3")


def _outlier_rows(layer: nn.Linear) -> None:
    """Each row gets one huge weight on an input that is always zero: the row's scale follows
    it, and fp8 (3 mantissa bits, nothing below 2**-9 of the scale) flushes the rest of the
    row, while bf16 keeps 8 significant bits of every value."""
    with torch.no_grad():
        layer.weight[:, 0] = 3e4


class ZeroFirst(nn.Module):
    """Zeroes the input column the outlier weights read."""

    def forward(self, x):
        return torch.cat([torch.zeros_like(x[:, :1]), x[:, 1:]], dim=1)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), ZeroFirst(), nn.Linear(WIDTH, WIDTH), nn.Tanh())
              for _ in range(8)]
    model = nn.Sequential(*blocks).eval()
    for name in OUTLIERS:
        _outlier_rows(model.get_submodule(name))
    return model


def _inputs(seed: int) -> torch.Tensor:
    return torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_memory_tune_stores_fp8_with_the_layers_that_fail_it_kept_16_bit_and_says_why():
    model = _model()
    evaluator = InProcessEvaluator(model, _inputs, model, seeds=(0, 1), repeat=1, name="outliers")
    result = tune("outliers", "sqnr>=30", evaluator=evaluator, objective="memory", dtypes=("bf16",), local_search=False,
                  validation_seeds=(7, 8))
    assert result.met
    rules = {r.match: r for r in result.policy.rules}
    kept = {m for m, r in rules.items() if m != "*" and r.storage in ("bf16", "fp16")}
    assert kept and kept <= set(OUTLIERS)  # only layers that flush in fp8; as few as the bound allows
    assert rules["*"].storage == "fp8" and f"except {len(kept)} layer(s) kept in" in rules["*"].reason
    assert all("its own error with fp8 weights measured" in rules[m].reason for m in kept)
    steps = [c.step for c in result.path]
    assert any(s.startswith("all-fp8") for s in steps) and any(s.startswith(f"verify fp8 with {len(kept)} in") for s in steps)
    # smaller than every 16-bit candidate measured
    sixteen = [c.evaluation.memory_bytes for c in result.path if c.step.startswith("all-bf16")]
    assert result.chosen.evaluation.memory_bytes < min(sixteen)
    with torch.no_grad(), mixprec.apply(model, result.policy) as applied:
        rows = {r["module"]: r for r in applied.explain()}
        name = sorted(kept)[0]
        assert rows[name]["storage"] != "fp8" and rows[f"{name[0]}.0"]["storage"] == "fp8"
        assert "kept in" in rows[name]["reason"]


def test_the_fp8_step_is_skipped_when_asked_and_gives_up_where_most_layers_need_16_bits():
    model = _model()
    evaluator = InProcessEvaluator(model, _inputs, model, seeds=(0, 1), repeat=1, name="outliers")
    off = tune("outliers", "sqnr>=30", evaluator=evaluator, objective="memory", dtypes=("bf16",), local_search=False,
               validation_seeds=(7,), fp8=False)
    assert off.met and not any("fp8" in c.step for c in off.path)
    # a bound no fp8 layer meets: one look at three quarters of the layers, then the 16-bit result stays
    strict = tune("outliers", "sqnr>=60", evaluator=evaluator, objective="memory", dtypes=("bf16",), local_search=False,
                  validation_seeds=(7,))
    fp8_steps = [c.step for c in strict.path if "fp8" in c.step]
    assert len(fp8_steps) <= 2 and all(r.storage != "fp8" for r in strict.policy.rules)
    assert any("more than three quarters of the layers" in n for n in strict.notes)
