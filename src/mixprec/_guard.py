"""The numerics guard: catch non-finite outputs, name the module, fall back safely.

``guard(applied)`` checks each component's floating outputs with one finiteness
reduction per component call (no per-module hooks, so it costs little). On the first
non-finite output it re-runs that call with per-module hooks and reports the first
module, in execution order, whose output is non-finite or beyond its dtype's range.
With ``on_nonfinite="fallback"`` it then pins only that module (then its enclosing
block, then the component) to the next precision in the chain fp16 -> bf16 (where the
probe measured bf16 fast) -> fp32, re-runs the call and returns the finite result with
a warning naming what changed. The decision is remembered on disk, keyed by a
fingerprint of the model structure and weights plus the hardware, so the next start
applies it before the first call.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from mixprec._apply import DTYPES, Applied
from mixprec._hooks import EntryGate
from mixprec.hardware import Hardware, cache_dir, probe
from mixprec.policy import Rule, iter_modules

__all__ = ["guard", "Guard", "NonFiniteError", "OverflowReport", "FallbackStore", "fingerprint", "GUARD_MODES", "ON_NONFINITE"]

GUARD_MODES = ("components", "modules", "off")
ON_NONFINITE = ("raise", "fallback", "warn")
_ORDER = {"fp16": 0, "bf16": 1, "fp32": 2}
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
    """

    component: str
    module: str | None
    type: str | None
    dtype: str | None
    input_absmax: float | None
    output_absmax: float | None
    dtype_max: float | None
    reason: str

    def __str__(self) -> str:
        if self.module is None:
            return f"component {self.component!r} returned non-finite values; no single module produced them"
        return (f"{self.module} ({self.type}, {self.dtype}) produced {self.reason} output in component {self.component!r}: "
                f"output absmax {self.output_absmax:.4g}, input absmax {self.input_absmax:.4g}, {self.dtype} max {self.dtype_max:.6g}")


class NonFiniteError(RuntimeError):
    """A component produced non-finite values and the guard could not (or was told not to) fix it."""

    def __init__(self, report: OverflowReport, note: str = ""):
        self.report = report
        super().__init__(f"non-finite output: {report}" + (f"; {note}" if note else ""))


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


# -- fingerprints and the on-disk memory -------------------------------------------------


def fingerprint(applied: Applied, hardware: Hardware) -> str:
    """Hash of the model structure, its original weights (sampled) and the hardware."""
    h = hashlib.sha256()
    h.update(json.dumps([hardware.device_type, hardware.name, hardware.torch_version]).encode())
    originals = applied.original_tensors()
    for qualname, module in iter_modules(applied.components):
        h.update(f"{qualname}:{type(module).__name__}".encode())
        for key, t in list(module._parameters.items()) + list(module._buffers.items()):
            if t is None:
                continue
            t = originals.get(id(t), t)
            h.update(f"{key}:{tuple(t.shape)}:{t.dtype}".encode())
            if t.numel():
                flat = t.detach().reshape(-1)
                step = max(1, flat.numel() // 64)
                h.update(flat[::step][:64].to("cpu", torch.float64).numpy().tobytes())
    return h.hexdigest()[:24]


class FallbackStore:
    """Remembered fallbacks: ``{fingerprint: {"pins": {module: dtype}, ...}}`` in a JSON file."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else cache_dir() / "fallbacks.json"

    def load(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            warnings.warn(f"ignoring unreadable fallback store {self.path}: {exc}", stacklevel=2)
            return {}

    def get(self, key: str) -> dict[str, str]:
        return dict(self.load().get(key, {}).get("pins", {}))

    def remember(self, key: str, module: str, dtype: str, description: str) -> None:
        data = self.load()
        entry = data.setdefault(key, {"pins": {}, "model": description})
        entry["pins"][module] = dtype
        entry["updated"] = time.strftime("%Y-%m-%d %H:%M:%S")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        tmp.replace(self.path)

    def clear(self, key: str | None = None) -> int:
        """Forget one fingerprint's pins, or all; returns how many entries were removed."""
        data = self.load()
        if key is None:
            removed = len(data)
            data = {}
        else:
            removed = int(data.pop(key, None) is not None)
        if self.path.exists():
            self.path.write_text(json.dumps(data, indent=2, sort_keys=True))
        return removed


# -- the guard ---------------------------------------------------------------------------


def _exact(qualname: str) -> str:
    """A glob that matches exactly this qualified name."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in qualname)


def _rewind_points(args: tuple, kwargs: dict) -> list[tuple[Any, int]]:
    # KV caches (transformers Cache objects) grow during a call; remember their length
    # so a re-run starts from the same state. The cache's dtype is not converted: a
    # fallback that widens attention projections in the middle of a cached decoding
    # loop (rather than at its first call) needs a fresh cache.
    points = []
    for value in list(args) + list(kwargs.values()):
        if hasattr(value, "get_seq_length") and hasattr(value, "crop"):
            points.append((value, int(value.get_seq_length())))
    return points


class Guard:
    """Watches an :class:`~mixprec.Applied` model for non-finite outputs. Use :func:`guard`."""

    def __init__(self, applied: Applied, mode: str, on_nonfinite: str, hardware: Hardware | None,
                 remember: bool, store: FallbackStore | None):
        self.applied = applied
        self.mode = mode
        self.on_nonfinite = on_nonfinite
        self._hardware = hardware
        self.remember = remember
        self.store = store or FallbackStore()
        self.pins: dict[str, str] = {}
        self.reports: list[OverflowReport] = []
        self._handles: list[Any] = []
        self._busy = False
        self._fingerprint: str | None = None

    # -- set-up ----------------------------------------------------------------------
    @property
    def hardware(self) -> Hardware:
        if self._hardware is None:
            self._hardware = probe()
        return self._hardware

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.applied, self.hardware)
        return self._fingerprint

    def _install(self) -> None:
        if self.mode == "off":
            return
        for cname, root in self.applied.components.items():
            gate = EntryGate()
            self._handles.extend(gate.install(root))
            # The component's own forward, and its direct children when it is used through
            # another method (vae.decode): one finiteness check per entry call.
            for entry in (root, *root.children()):
                self._watch(cname, entry, None if entry is root else gate)
            if self.mode == "modules":
                for name, sub in root.named_modules():
                    if sub is not root:
                        self._handles.append(sub.register_forward_hook(self._module_check(cname, name)))

    def _watch(self, cname: str, entry: nn.Module, gate: EntryGate | None) -> None:
        stack: list[tuple[tuple, dict, list] | None] = []

        def pre(module, args, kwargs):
            outside = gate is None or gate.outside
            stack.append((args, kwargs, _rewind_points(args, kwargs)) if outside else None)

        def post(module, args, kwargs, output):
            call = stack.pop() if stack else None
            if self._busy or call is None or all_finite(output):
                return None
            return self._handle(cname, module, call, output)

        self._handles.append(entry.register_forward_pre_hook(pre, with_kwargs=True, prepend=True))
        self._handles.append(entry.register_forward_hook(post, with_kwargs=True))

    def _module_check(self, cname: str, name: str):
        def hook(module, args, output):
            if not self._busy and not all_finite(output):
                warnings.warn(f"mixprec guard: {cname}.{name} ({type(module).__name__}) produced non-finite output", stacklevel=2)
        return hook

    def apply_remembered(self) -> dict[str, str]:
        """Pin modules remembered for this model and hardware, where the policy is narrower."""
        remembered = self.store.get(self.fingerprint)
        plans = {p.qualname: p for p in self.applied.plans}
        wanted = {m: d for m, d in remembered.items() if m in plans and _ORDER[plans[m].storage] < _ORDER[d]}
        if wanted:
            self._pin(wanted, reason="remembered guard fallback")
        return wanted

    def _pin(self, pins: dict[str, str], reason: str) -> None:
        self.pins.update(pins)
        rules = tuple(Rule(_exact(m), storage=d, keep_fp32=d == "fp32" or None, reason=f"{reason}: {m} -> {d}") for m, d in pins.items())
        self.applied.reapply(self.applied.policy.with_rules(*rules))

    def remove(self) -> None:
        """Remove the guard's hooks (pins stay in the applied policy)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    # -- localisation --------------------------------------------------------------------
    def _rerun(self, root: nn.Module, call: tuple) -> Any:
        args, kwargs, points = call
        for cache, length in points:
            grown = int(cache.get_seq_length()) - length
            if length == 0 and hasattr(cache, "reset"):
                cache.reset()  # drop the failed call's tensors entirely (their dtype too)
            elif grown > 0:
                cache.crop(-grown)  # a negative count removes that many tokens (transformers 4.x and 5.x)
        self._busy = True
        try:
            return root(*args, **kwargs)
        finally:
            self._busy = False

    def localise(self, cname: str, root: nn.Module, call: tuple) -> OverflowReport:
        """Re-run one component call with per-module hooks; name the first bad module."""
        plans = {id(p.module): p for p in self.applied.plans}
        parents = {id(c): m for m in root.modules() for c in m.children()}
        found: list[OverflowReport] = []
        handles = []

        def check(module, args, output):
            if found:
                return
            tensors = list(_floats(output))
            if not tensors:
                return
            dtype = tensors[0].dtype
            limit = _narrowest_max(dtype, plans.get(id(parents.get(id(module)))))
            finite = all_finite(output)
            out_max = _absmax(output)
            if not finite or (out_max is not None and out_max > limit):
                plan = plans.get(id(module))
                found.append(OverflowReport(
                    component=cname, module=plan.qualname if plan else type(module).__name__, type=type(module).__name__,
                    dtype=_NAMES.get(dtype, str(dtype)), input_absmax=_absmax(args, finite_only=True) or 0.0,
                    output_absmax=out_max if out_max is not None else math.nan, dtype_max=limit,
                    reason="non-finite" if not finite else "beyond dtype range"))

        for sub in root.modules():
            if sub is not root:
                # prepend: see each module's own output, before a boundary casts it for its caller
                handles.append(sub.register_forward_hook(check, prepend=True))
        try:
            output = self._rerun(root, call)
        finally:
            for h in handles:
                h.remove()
        if found:
            return found[0]
        return OverflowReport(cname, None, None, None, None, _absmax(output), None, "non-finite")

    # -- the decision ----------------------------------------------------------------------
    def _chain_after(self, dtype: str) -> list[str]:
        chain = ["fp16"] + (["bf16"] if self.hardware.is_fast("bf16") else []) + ["fp32"]
        return [d for d in chain if _ORDER[d] > _ORDER[dtype]]

    def _scopes(self, report: OverflowReport) -> list[str]:
        """The offending module, its enclosing block (nearest callable ancestor), the component."""
        plans = {p.qualname: p for p in self.applied.plans}
        scopes = []
        if report.module in plans:
            scopes.append(report.module)
            name = report.module
            while "." in name:
                name = name.rpartition(".")[0]
                if name in plans and not isinstance(plans[name].module, (nn.ModuleList, nn.ModuleDict)):
                    scopes.append(name)
                    break
        if report.component not in scopes:
            scopes.append(report.component)
        return scopes

    def _next_step(self, report: OverflowReport) -> tuple[str, str] | None:
        plans = {p.qualname: p for p in self.applied.plans}
        for scope in self._scopes(report):
            if scope == report.module and report.reason == "beyond dtype range":
                # The module holds the value in its own dtype; its caller's dtype cannot:
                # widening the module again would not help, its enclosing block must widen.
                continue
            wider = self._chain_after(plans[scope].storage if scope in plans else "fp32")
            if wider:
                return scope, wider[0]
        return None

    def _handle(self, cname: str, root: nn.Module, call: tuple, output: Any) -> Any:
        report = self.localise(cname, root, call)
        self.reports.append(report)
        if self.on_nonfinite == "raise":
            raise NonFiniteError(report)
        if self.on_nonfinite == "warn":
            warnings.warn(f"mixprec guard: non-finite output: {report}", stacklevel=2)
            return None
        return self._fallback(cname, root, call, report)

    def _fallback(self, cname: str, root: nn.Module, call: tuple, report: OverflowReport) -> Any:
        first = report
        changes: list[str] = []
        for _ in range(12):  # each round pins one scope one step wider
            step = self._next_step(report)
            if step is None:
                raise NonFiniteError(report, "fallback exhausted: nothing left to widen" + (f"; tried {', '.join(changes)}" if changes else ""))
            scope, dtype = step
            self._pin({scope: dtype}, reason="guard fallback")
            changes.append(f"{scope} -> {dtype}")
            output = self._rerun(root, call)
            if all_finite(output):
                if self.remember:
                    for change in changes:
                        module, _, d = change.partition(" -> ")
                        self.store.remember(self.fingerprint, module, d, description=", ".join(self.applied.components))
                warnings.warn(f"mixprec guard: {first}; pinned {', '.join(changes)} and re-ran the call"
                              + ("; remembered for the next start" if self.remember else ""), stacklevel=3)
                return output
            report = self.localise(cname, root, call)
            self.reports.append(report)
        raise NonFiniteError(report, f"fallback gave up after {len(changes)} changes: {', '.join(changes)}")


def _narrowest_max(dtype: torch.dtype, parent_plan: Any) -> float:
    limit = torch.finfo(dtype).max
    if parent_plan is not None:
        limit = min(limit, torch.finfo(DTYPES[parent_plan.compute_dtype]).max)
    return float(limit)


def guard(
    applied: Applied,
    mode: str = "components",
    on_nonfinite: str = "raise",
    *,
    hardware: Hardware | None = None,
    remember: bool = True,
    store: FallbackStore | None = None,
) -> Guard:
    """Watch an applied policy for non-finite outputs.

    Args:
        applied: what :func:`mixprec.apply` returned.
        mode: ``components`` (one finiteness check per component call), ``modules``
            (also warn per module, slower), or ``off``.
        on_nonfinite: ``raise`` a :class:`NonFiniteError` carrying the report, ``fallback``
            (pin the offending module wider, re-run, return a finite result and warn), or
            ``warn`` (report and return the output unchanged).
        hardware: the probe result (default: :func:`mixprec.hardware.probe`, cached).
        remember: store fallbacks on disk and re-apply remembered ones now.
        store: where to remember (default: ``fallbacks.json`` in the mixprec cache dir).

    Example:
        >>> applied = mixprec.apply(pipe, mixprec.preset("memory"))
        >>> g = mixprec.guard(applied, on_nonfinite="fallback")
    """
    if not isinstance(applied, Applied):
        raise TypeError(f"guard() needs what mixprec.apply() returned, got {type(applied).__name__}")
    if mode not in GUARD_MODES:
        raise ValueError(f"unknown guard mode {mode!r}; choose one of: {', '.join(GUARD_MODES)}")
    if on_nonfinite not in ON_NONFINITE:
        raise ValueError(f"unknown on_nonfinite {on_nonfinite!r}; choose one of: {', '.join(ON_NONFINITE)}")
    if not applied.active:
        raise ValueError("this policy was reverted; apply it again before guarding it")
    g = Guard(applied, mode, on_nonfinite, hardware, remember, store)
    if remember and on_nonfinite == "fallback":
        g.apply_remembered()
    g._install()
    return g
