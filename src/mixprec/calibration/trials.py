"""Running a calibration's candidates on the target: how it is called, what of its output is
compared with fp32's, and one candidate applied at a time (reverted before the next)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from typing import Any, Callable, Mapping

import torch
from torch import nn

from mixprec.calibration.candidates import Candidate
from mixprec.casting.apply import Applied
from mixprec.casting.apply import apply as apply_policy
from mixprec.casting.targets import components_of, weight_bytes
from mixprec.device.clock import Clock
from mixprec.measure.metrics import sqnr_db
from mixprec.pipelines._base import Pipeline, PipelineOutput
from mixprec.policy import Policy
from mixprec.policy.select import UnmatchedRuleWarning

__all__ = ["Trials", "default_run", "detached", "output_quality", "device_of", "short"]

#: A candidate's calls per round are repeated (the fastest kept) up to this many seconds of its clock.
ROUND_TARGET_S = 0.02


def default_run(target: Any) -> Callable[[Any], Any]:
    if isinstance(target, Pipeline):
        return target.run
    if not isinstance(target, nn.Module):
        raise ValueError(f"calibrating a {type(target).__name__}: pass run= (inputs -> outputs), as mixprec cannot "
                         "know how to call it")

    def call(inputs: Any) -> Any:
        if isinstance(inputs, Mapping):
            return target(**inputs)
        if isinstance(inputs, (tuple, list)):
            return target(*inputs)
        return target(inputs)

    return call


def _tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """The floating-point tensors of an output (tensors, sequences, mappings, dataclasses such as a ModelOutput)."""
    if depth > 8:
        return []
    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() or value.is_complex() else []
    if isinstance(value, PipelineOutput):
        extras = [v for v in value.extras().values() if isinstance(v, torch.Tensor)]
        return _tensors(value.output, depth + 1) + [t for e in extras for t in _tensors(e, depth + 1)]
    if isinstance(value, Mapping):
        return [t for v in value.values() for t in _tensors(v, depth + 1)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v, depth + 1)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in _tensors(getattr(value, f.name), depth + 1)]
    return []


def detached(value: Any) -> list[torch.Tensor]:
    return [t.detach().to("cpu", torch.complex128 if t.is_complex() else torch.float64).clone() for t in _tensors(value)]


def output_quality(out: list[torch.Tensor], ref: list[torch.Tensor]) -> tuple[float, int]:
    """The worst SQNR over the output tensors, and the count of non-finite values."""
    if len(out) != len(ref):
        raise ValueError(f"the output holds {len(out)} floating-point tensors where fp32's held {len(ref)}")
    if not ref:
        raise ValueError("the output holds no floating-point tensor to compare with fp32's")
    nonfinite = sum(int((~torch.isfinite(o)).sum()) for o in out)
    worst = math.inf
    for o, r in zip(out, ref):
        if o.is_complex() or r.is_complex():
            o, r = torch.view_as_real(o.to(torch.complex128)), torch.view_as_real(r.to(torch.complex128))
        value = sqnr_db(o, r)
        worst = min(worst, value) if not math.isnan(value) else -math.inf
    return worst, nonfinite


def device_of(components: dict[str, nn.Module]) -> torch.device:
    for root in components.values():
        for tensor in [*root.parameters(), *root.buffers()]:
            if tensor.is_floating_point() and not tensor.is_meta:
                return tensor.device
    return torch.device("cpu")


def _applied(target: Any, policy: Policy | None) -> contextlib.AbstractContextManager:
    if policy is None:
        return contextlib.nullcontext()
    with warnings.catch_warnings():
        # A preset's optional rules (output heads, norms) may match nothing in this model: not news here.
        warnings.simplefilter("ignore", UnmatchedRuleWarning)
        return apply_policy(target, policy, keep_original="cpu")


def short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}{'...' if len(text) > 200 else ''}"


class Trials:
    """Runs candidates on the target, one applied at a time (reverted before the next)."""

    def __init__(self, target: Any, run: Callable[[Any], Any], inputs: Any, clock: Clock):
        self.target, self.run, self.inputs, self.clock = target, run, inputs, clock
        self.calls: dict[str, int] = {}

    @property
    def components(self) -> dict[str, nn.Module]:
        return components_of(self.target)[0]

    def first(self, cand: Candidate) -> tuple[Any, int, float]:
        """One untimed call (warm-up): the output, the weight bytes under the policy, and one call's clock seconds."""
        with _applied(self.target, cand.policy) as applied, torch.inference_mode():
            result, seconds = self.clock.time(lambda: self.run(self.inputs))
            out = detached(result)
            size = applied.weight_bytes() if isinstance(applied, Applied) else weight_bytes(self.components)
        return out, size, seconds

    def timed(self, cand: Candidate) -> float:
        """The fastest of this candidate's calls in one round (one or more: a call of a few
        milliseconds is repeated up to :data:`ROUND_TARGET_S` of its clock)."""
        with _applied(self.target, cand.policy), torch.inference_mode():
            best = math.inf
            for _ in range(self.calls.get(cand.label, 1)):
                _, seconds = self.clock.time(lambda: self.run(self.inputs))
                best = min(best, seconds)
        return best
