"""Non-finite outputs: the finiteness check, the :class:`OverflowReport` naming the first
module whose output overflowed and how a re-run with per-module hooks finds it, and the
errors the guard raises with it.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn

from mixprec.casting.hooks import register_first
from mixprec.casting.targets import DTYPES
from mixprec.policy import ModulePlan

__all__ = ["OverflowReport", "NonFiniteError", "NonFiniteInputError", "all_finite", "first_nonfinite", "localise_overflow"]

_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


@dataclass(frozen=True)
class OverflowReport:
    """Where a non-finite output came from.

    Attributes:
        component: the component whose output was non-finite.
        module: qualified name of the first module (in execution order) whose output
            was non-finite or beyond its dtype's range; ``None`` if no module was found
            (the component's own functional code produced it).
        type: that module's class name.
        dtype: the dtype of its output.
        input_absmax: largest finite absolute value among its floating inputs.
        output_absmax: largest absolute value of its output (``inf``/``nan`` when non-finite).
        dtype_max: the largest finite value of the dtype (65,504 for fp16).
        reason: ``non-finite`` or ``beyond dtype range``.
        limit_dtype: the dtype whose range ``dtype_max`` is.
        consumer: when that is not the module's own dtype, the enclosing module that
            computes in it and so receives the value (``None`` otherwise).
    """

    component: str
    module: str | None
    type: str | None
    dtype: str | None
    input_absmax: float | None
    output_absmax: float | None
    dtype_max: float | None
    reason: str
    limit_dtype: str | None = None
    consumer: str | None = None

    def __str__(self) -> str:
        if self.module is None:
            return f"component {self.component!r} returned non-finite values; no single module produced them"
        head = (f"{self.module} ({self.type}, {self.dtype}) produced {self.reason} output in component {self.component!r}: "
                f"output absmax {self.output_absmax:.4g}, input absmax {self.input_absmax:.4g}")
        if self.consumer is not None:
            return (f"{head}; it cannot be represented in {self.limit_dtype} (max {self.dtype_max:.6g}), "
                    f"the compute dtype of {self.consumer}, which consumes it")
        return f"{head}, {self.limit_dtype or self.dtype} max {self.dtype_max:.6g}"


class NonFiniteError(RuntimeError):
    """A component produced non-finite values and the guard could not (or was told not to) fix it."""

    def __init__(self, report: OverflowReport, note: str = ""):
        self.report = report
        super().__init__(f"non-finite output: {report}" + (f"; {note}" if note else ""))


class NonFiniteInputError(ValueError):
    """A guarded call received NaN or inf: the input is bad, no module or precision is to blame."""

    def __init__(self, component: str, argument: str):
        self.component, self.argument = component, argument
        super().__init__(f"component {component!r} was called with non-finite values in {argument}: the input is bad, "
                         "not the precision; nothing was pinned or changed")


# -- finiteness -------------------------------------------------------------------------


def _floats(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _floats(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _floats(o)


def all_finite(obj: Any) -> bool:
    """One reduction (and one host sync) over every floating tensor in ``obj``."""
    tensors = list(_floats(obj))
    if not tensors:
        return True
    if len(tensors) == 1:
        return bool(torch.isfinite(tensors[0]).all())
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())


def first_nonfinite(obj: Any, path: str = "") -> str | None:
    """Where in ``obj`` (tensors, tuples, lists, dicts, dataclasses) the first floating tensor
    holding inf or NaN is, as an index path such as ``[0]['x']``; ``None`` when all are finite."""
    if isinstance(obj, torch.Tensor):
        return None if not obj.is_floating_point() or bool(torch.isfinite(obj).all()) else (path or "the input")
    if isinstance(obj, (tuple, list)):
        items: Any = enumerate(obj)
    elif isinstance(obj, dict):
        items = ((repr(k), v) for k, v in obj.items())
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        items = ((f".{f.name}", getattr(obj, f.name, None)) for f in dataclasses.fields(obj))
        return next((found for name, value in items if (found := first_nonfinite(value, path + name))), None)
    else:
        return None
    return next((found for key, value in items if (found := first_nonfinite(value, f"{path}[{key}]"))), None)


def _absmax(obj: Any, finite_only: bool = False) -> float | None:
    best = None
    for t in _floats(obj):
        if t.numel() == 0:
            continue
        a = t.detach().abs().float()
        if finite_only:
            a = a[torch.isfinite(a)]
            if a.numel() == 0:
                continue
        value = float(a.max()) if not torch.isnan(a).any() else math.nan
        best = value if best is None or (math.isnan(value) or value > best) else best
    return best


def localise_overflow(cname: str, root: nn.Module, plans: list[ModulePlan], rerun: Callable[[], Any]) -> OverflowReport:
    """Run ``rerun`` (one call of component ``cname``) with per-module hooks on ``root``; name the first bad module."""
    by_id = {id(p.module): p for p in plans}
    parents = {id(c): m for m in root.modules() for c in m.children()}
    found: list[OverflowReport] = []
    handles = []
    caller = threading.get_ident()

    def check(module, args, output):
        if found or threading.get_ident() != caller:
            return  # another thread's call of the same model is not this re-run
        tensors = list(_floats(output))
        if not tensors:
            return
        dtype = tensors[0].dtype
        consumer = by_id.get(id(parents.get(id(module))))
        limit, limit_dtype = _narrowest_max(dtype, consumer)
        finite = all_finite(output)
        out_max = _absmax(output)
        if not finite or (out_max is not None and out_max > limit):
            plan = by_id.get(id(module))
            narrower = limit_dtype != dtype
            found.append(OverflowReport(
                component=cname, module=plan.qualname if plan else type(module).__name__, type=type(module).__name__,
                dtype=_NAMES.get(dtype, str(dtype)), input_absmax=_absmax(args, finite_only=True) or 0.0,
                output_absmax=out_max if out_max is not None else math.nan, dtype_max=limit,
                reason="non-finite" if not finite else "beyond dtype range",
                limit_dtype=_NAMES.get(limit_dtype, str(limit_dtype)),
                consumer=(consumer.qualname or "(root)") if (narrower and consumer is not None) else None))

    for sub in root.modules():
        if sub is not root:
            # prepend: see each module's own output, before a boundary casts it for its caller
            handles.append(register_first(sub, "forward", check))
    try:
        output = rerun()
    finally:
        for h in handles:
            h.remove()
    if found:
        return found[0]
    return OverflowReport(cname, None, None, None, None, _absmax(output), None, "non-finite")


def _narrowest_max(dtype: torch.dtype, consumer_plan: Any) -> tuple[float, torch.dtype]:
    """The largest value the output can hold where it is used: its own dtype's, or the consumer's if narrower."""
    limit, limit_dtype = float(torch.finfo(dtype).max), dtype
    if consumer_plan is not None:
        consumer = DTYPES[consumer_plan.compute_dtype]
        if float(torch.finfo(consumer).max) < limit:
            limit, limit_dtype = float(torch.finfo(consumer).max), consumer
    return limit, limit_dtype
