"""Per-module numerics profile: range, headroom, underflow, own and inherited error.

``profile(target, inputs, policy)`` runs the target twice on the same inputs:

1. in fp32 (the original weights), recording per module the absmax of its inputs and
   outputs, its fp16 headroom (absmax / 65,504), and the fraction of its non-zero
   output values that fall below the smallest normal number of fp16 and of bf16
   (they underflow to subnormals or zero); for every module the policy puts in 16 bits
   it also runs a 16-bit copy of the module on the fp32 module's own input and compares
   with the fp32 output: the module's **own error**, as SQNR in dB;
2. under the policy, comparing each module's output with the fp32 run's output at the
   same call: the **inherited error**, everything upstream included.

Modules called several times per run (decoding loops, shared blocks) are profiled per
call and summarised per module with the call count: the largest absmax and the worst
(lowest) SQNR over its calls. Outputs are compared on a fixed strided sample of at most
65,536 values per call, so memory stays bounded on large activations.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from mixprec._apply import DTYPES, apply, components_of
from mixprec._hooks import cast_floats
from mixprec.policy import ModulePlan, Policy, resolve_modules

__all__ = ["profile", "Profile", "ModuleStats", "FP16_MAX", "sqnr_db"]

FP16_MAX = float(torch.finfo(torch.float16).max)
_SAMPLE = 65536
_TINY = {"fp16": float(torch.finfo(torch.float16).tiny), "bf16": float(torch.finfo(torch.bfloat16).tiny)}


def sqnr_db(test: torch.Tensor, reference: torch.Tensor) -> float:
    """Signal-to-quantisation-noise ratio of ``test`` against ``reference`` in dB (inf if equal)."""
    ref = reference.double()
    noise = (test.double() - ref).pow(2).sum().item()
    signal = ref.pow(2).sum().item()
    if noise == 0:
        return math.inf
    if signal == 0 or not math.isfinite(noise):
        return -math.inf
    return 10.0 * math.log10(signal / noise)


@dataclass
class ModuleStats:
    """One module's profile (worst case over its calls)."""

    module: str
    type: str
    storage: str
    compute: str
    calls: int = 0
    input_absmax: float = 0.0
    output_absmax: float = 0.0
    underflow_fp16: float = 0.0
    underflow_bf16: float = 0.0
    own_sqnr_db: float | None = None
    inherited_sqnr_db: float | None = None
    #: The 16-bit copy produced inf/NaN on the fp32 input (an internal overflow).
    own_nonfinite: bool = False

    @property
    def fp16_headroom(self) -> float:
        """Largest absolute value seen over fp16's max: 1.0 or more overflows fp16."""
        return max(self.input_absmax, self.output_absmax) / FP16_MAX

    @property
    def overflows_fp16(self) -> bool:
        """Its output exceeds fp16's range, or its fp16 copy overflowed inside."""
        internal = self.own_nonfinite and self.compute == "fp16"
        return internal or self.output_absmax >= FP16_MAX or not math.isfinite(self.output_absmax)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["fp16_headroom"] = self.fp16_headroom
        data["overflows_fp16"] = self.overflows_fp16
        return data


@dataclass
class Profile:
    """The result of :func:`profile`."""

    policy: Policy
    modules: list[ModuleStats] = field(default_factory=list)

    def by_risk(self) -> list[ModuleStats]:
        """Modules that overflow fp16 first, then by lowest own error SQNR, then by headroom."""
        def key(s: ModuleStats):
            own = s.own_sqnr_db if s.own_sqnr_db is not None else math.inf
            return (not s.overflows_fp16, own, -s.fp16_headroom)

        return sorted(self.modules, key=key)

    def rows(self) -> list[dict[str, Any]]:
        """Plain rows (JSON-safe: infinities become strings) for tables and the benchmark store."""
        return [{k: _json_safe(v) for k, v in s.to_dict().items()} for s in self.by_risk()]

    def to_json(self) -> str:
        return json.dumps({"policy": self.policy.to_dict(), "modules": self.rows()}, indent=2)

    def suggestions(self, *, min_own_sqnr_db: float = 20.0) -> list[dict[str, Any]]:
        """Keep-fp32 rules that would fix the risky modules: fp16 overflow, or own SQNR below the bound."""
        out = []
        for s in self.by_risk():
            if s.compute == "fp32" and s.storage == "fp32":
                continue
            if s.own_nonfinite:
                reason = f"its {s.compute} copy produces inf/NaN on the fp32 input (overflow inside the module)"
            elif s.overflows_fp16 and "fp16" in (s.compute, s.storage):
                reason = f"absmax {s.output_absmax:.4g} exceeds fp16's {FP16_MAX:.0f}"
            elif s.own_sqnr_db is not None and s.own_sqnr_db < min_own_sqnr_db:
                reason = f"own error {s.own_sqnr_db:.1f} dB SQNR in {s.compute} (< {min_own_sqnr_db:g} dB)"
            else:
                continue
            out.append({"match": s.module, "keep_fp32": True, "reason": reason})
        return out

    def suggestions_toml(self, **kwargs: Any) -> str:
        import tomli_w

        rules = self.suggestions(**kwargs)
        return tomli_w.dumps({"rules": rules}) if rules else ""


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _sample(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().reshape(-1)
    step = max(1, math.ceil(flat.numel() / _SAMPLE))
    return flat[::step].to("cpu", torch.float32).clone()


def _first_float(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj if obj.is_floating_point() else None
    if isinstance(obj, (tuple, list)):
        values = obj
    elif isinstance(obj, dict):
        values = list(obj.values())
    else:
        return None
    for v in values:
        found = _first_float(v)
        if found is not None:
            return found
    return None


def _absmax(t: torch.Tensor | None) -> float:
    if t is None or t.numel() == 0:
        return 0.0
    a = t.detach().abs().float()
    if torch.isnan(a).any():
        return math.nan
    return float(a.max())


def _owns_weights(module: nn.Module) -> bool:
    return any(p is not None and p.is_floating_point() for p in module._parameters.values())


def _low_precision_clone(module: nn.Module, plan: ModulePlan) -> nn.Module:
    clone = copy.deepcopy(module)
    storage, compute = DTYPES[plan.storage], DTYPES[plan.compute_dtype]
    for t in list(clone.parameters()) + list(clone.buffers()):
        if t.is_floating_point():
            t.data = t.data.to(storage).to(compute)
    return clone


def _default_runner(target: Any) -> Callable[[Any], Any]:
    if hasattr(target, "run"):
        return target.run
    if isinstance(target, nn.Module):
        return lambda inputs: target(*inputs) if isinstance(inputs, tuple) else target(inputs)
    raise TypeError("profile() needs a pipeline, an nn.Module, or run= for a mapping of components")


def profile(target: Any, inputs: Any, policy: Policy, *, run: Callable[[Any], Any] | None = None) -> Profile:
    """Profile every module of ``target`` on ``inputs`` in fp32 and under ``policy``.

    Args:
        target: a pipeline, an ``nn.Module`` or a mapping of components (then give ``run``).
        inputs: what the pipeline's ``run`` (or the module) takes.
        policy: the precision policy whose 16-bit choices are profiled.
        run: how to run the target on inputs (default: ``target.run`` or ``target(inputs)``).

    Returns:
        A :class:`Profile`.

    Example:
        >>> prof = mixprec.profile(pipe, pipe.example_inputs(1, 0), mixprec.preset("memory"))
        >>> print(prof.suggestions_toml())
    """
    comps, _ = components_of(target)
    runner = run or _default_runner(target)
    plans, _ = resolve_modules(comps, policy)
    stats: dict[int, ModuleStats] = {}
    names: dict[int, str] = {}
    for plan in plans:
        names[id(plan.module)] = plan.qualname
        stats[id(plan.module)] = ModuleStats(plan.qualname or "(root)", plan.type_name, plan.storage, plan.compute_dtype)
    clones = {id(p.module): _low_precision_clone(p.module, p) for p in plans
              if p.compute_dtype != "fp32" and _owns_weights(p.module)}

    reference: dict[tuple[int, int], torch.Tensor] = {}
    counters: dict[int, int] = {}

    def fp32_hook(module, args, kwargs, output):
        key = id(module)
        s = stats[key]
        index = counters.get(key, 0)
        counters[key] = index + 1
        s.calls += 1
        x, y = _first_float((args, kwargs)), _first_float(output)
        s.input_absmax = _nanmax(s.input_absmax, _absmax(x))
        if y is None:
            return
        s.output_absmax = _nanmax(s.output_absmax, _absmax(y))
        nonzero = y.detach()[y.detach() != 0].abs().float()
        if nonzero.numel():
            s.underflow_fp16 = max(s.underflow_fp16, float((nonzero < _TINY["fp16"]).float().mean()))
            s.underflow_bf16 = max(s.underflow_bf16, float((nonzero < _TINY["bf16"]).float().mean()))
        reference[(key, index)] = _sample(y)
        clone = clones.get(key)
        if clone is not None:
            dtype = DTYPES[stats[key].compute]
            low = _first_float(clone(*cast_floats(args, dtype, min_ndim=2), **cast_floats(kwargs, dtype, min_ndim=2)))
            if low is not None and low.shape == y.shape:
                s.own_nonfinite = s.own_nonfinite or not bool(torch.isfinite(low).all())
                own = sqnr_db(low.float(), y.float())
                s.own_sqnr_db = own if s.own_sqnr_db is None else min(s.own_sqnr_db, own)

    handles = []
    try:
        for plan in plans:
            handles.append(plan.module.register_forward_hook(fp32_hook, with_kwargs=True))
        with torch.inference_mode():
            fp32_out = runner(inputs)
    finally:
        for h in handles:
            h.remove()
        handles.clear()

    counters.clear()
    low_inputs = target.teacher_forced(inputs, fp32_out) if hasattr(target, "teacher_forced") else inputs

    def low_hook(module, args, output):
        key = id(module)
        index = counters.get(key, 0)
        counters[key] = index + 1
        y = _first_float(output)
        ref = reference.get((key, index))
        if y is None or ref is None:
            return
        sample = _sample(y)
        if sample.shape == ref.shape:
            value = sqnr_db(sample, ref)
            s = stats[key]
            s.inherited_sqnr_db = value if s.inherited_sqnr_db is None else min(s.inherited_sqnr_db, value)

    with apply(target if not isinstance(target, dict) else comps, policy):
        try:
            for plan in plans:
                # prepend: compare what the module computed, before a boundary casts it back
                handles.append(plan.module.register_forward_hook(low_hook, prepend=True))
            with torch.inference_mode():
                runner(low_inputs)
        finally:
            for h in handles:
                h.remove()
    return Profile(policy, [stats[id(p.module)] for p in plans if stats[id(p.module)].calls])


def _nanmax(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)
