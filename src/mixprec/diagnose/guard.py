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
applies it before the first call. The report and how the first bad module is found are
in :mod:`~mixprec.diagnose.overflow`, that memory in :mod:`~mixprec.diagnose.fallbacks`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import warnings
from typing import Any, Callable

import torch
from torch import nn

from mixprec.casting.apply import Applied
from mixprec.casting.meet import OP_ERRORS, DeferDtypeErrors, WidenMode, may_be_about_dtypes
from mixprec.casting.frames import inline_only
from mixprec.casting.hooks import add_method_hook, register_first
from mixprec.casting.targets import refuse_context
from mixprec.policy.tree import called_children, entry_methods
from mixprec.diagnose.dtype_errors import (DtypeErrorReport, PrecisionDtypeError, add_note, candidate_scopes, direct_callees,
                                          counterparts, is_dtype_error, locate,
                                          weight_owners)
from mixprec.diagnose.calls import CallLock, RecordedCall, ThreadState
from mixprec.diagnose.fallbacks import FallbackStore, Pin, fingerprint
from mixprec.diagnose.overflow import NonFiniteError, NonFiniteInputError, OverflowReport, all_finite, localise_overflow
from mixprec.device.hardware import Hardware, probe
from mixprec.policy import Rule

__all__ = ["guard", "Guard", "GUARD_MODES", "ON_NONFINITE"]

logger = logging.getLogger("mixprec")

GUARD_MODES = ("components", "modules", "off")
ON_NONFINITE = ("raise", "fallback", "warn")
_ORDER = {"fp16": 0, "bf16": 1, "fp32": 2}
#: A pin that widens only what a module hands back (``Rule(output_dtype="fp32")``), not what it computes in.
OUTPUT_FP32 = "fp32-output"
_FAILED = object()


# -- the guard ---------------------------------------------------------------------------


def _exact(qualname: str) -> str:
    """A glob that matches exactly this qualified name."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in qualname)


class _Pending(threading.local):
    """One entry's recorded call waiting for its finiteness check, on the calling thread."""

    def __init__(self) -> None:
        self.pending: list[RecordedCall] = []
        self.checked = False


class Guard:
    """Watches an :class:`~mixprec.Applied` model for non-finite outputs and dtype errors. Use :func:`guard`."""

    def __init__(self, applied: Applied, mode: str, on_nonfinite: str, hardware: Hardware | None,
                 remember: bool, store: FallbackStore | None):
        self.applied = applied
        self.mode = mode
        self.on_nonfinite = on_nonfinite
        self._hardware = hardware
        self.remember = remember
        self.store = store or FallbackStore()
        #: Modules pinned by this guard, by qualified name, with where each came from.
        self.pins: dict[str, Pin] = {}
        self.reports: list[OverflowReport | DtypeErrorReport] = []
        self._handles: list[Any] = []
        # Per-call state belongs to the calling thread; the weights are shared: forwards
        # hold a read of `_lock`, a re-apply its write. One fallback runs at a time.
        self._thread = ThreadState()
        self._lock = CallLock()
        self._fallbacks = threading.RLock()
        self._generation = 0
        self._fingerprint: str | None = None
        self._fingerprint_of = 0

    # -- set-up ----------------------------------------------------------------------
    @property
    def hardware(self) -> Hardware:
        if self._hardware is None:
            self._hardware = probe()
        return self._hardware

    @property
    def fingerprint(self) -> str:
        """The model's fingerprint; taken again after the app changed weights (load_state_dict)."""
        version = self.applied.weights_version
        if self._fingerprint is None or self._fingerprint_of != version:
            self._fingerprint, self._fingerprint_of = fingerprint(self.applied, self.hardware), version
        return self._fingerprint

    def _install(self) -> None:
        if self.mode == "off":
            return
        inline_only()  # the guard's frames, like apply's, are inlined by torch.compile or run eagerly
        for cname, root in self.applied.components.items():
            # Every way an app enters the component: its forward and its own methods
            # (S3Gen.inference, embed_ref, vae.decode), one check per outermost call.
            for name in entry_methods(root):
                self._wrap(cname, root, name)
            # A dtype error is the guard's to fix (a pin it remembers), not widened by apply.
            self._handles.append(DeferDtypeErrors(root))
            # Its direct children too, when called from outside any of those methods,
            # through __call__ or directly (tokenizer.forward(...), vocoder.inference(...)).
            for child in called_children(root):
                for name in entry_methods(child):
                    self._wrap(cname, child, name)
            if self.mode == "modules":
                for name, sub in root.named_modules():
                    if sub is not root:
                        self._handles.append(sub.register_forward_hook(self._module_check(cname, name)))

    def _wrap(self, cname: str, root: nn.Module, name: str) -> None:
        slot = _Pending()  # this entry's call waiting for its check, per thread
        state = self._thread
        if name == "forward":
            # What the caller passed, before the policy's boundary hooks cast it: a re-run
            # goes through __call__ again with the caller's own inputs, so the re-applied
            # policy's hooks (and gates) see a fresh call. Never traced by torch.compile:
            # it runs before a compiled call, as the check after it does.
            def remember(module, args, kwargs):
                if torch.compiler.is_compiling():
                    return  # a child inside a compiled component: traced away, no graph break
                if not state.busy and not state.depth[cname]:
                    slot.pending[:] = [self._record(root, args, kwargs)]
                    slot.checked = False

            # A compiled component (Policy.compile, module.compile(), torch.compile) runs
            # `entry` below as traced code, where the guard steps aside (a check there
            # would break the graph). This hook runs after the compiled call, eagerly,
            # checks its output, and on a non-finite one localises and falls back on an
            # eager re-run of the same call.
            @torch.compiler.disable
            def after_compiled(module, args, output):
                if state.busy or state.depth[cname] or slot.checked or not slot.pending:
                    return None
                call = slot.pending.pop()
                if all_finite(output):
                    return None
                with torch.compiler.set_stance("force_eager"):
                    return self._handle(cname, root, call, output)

            component = root is self.applied.components.get(cname)
            if component:
                # The component's own hooks run outside any compiled region (torch.compile
                # does not trace the module call that runs them): eager, always.
                remember = torch.compiler.disable(remember)
            self._handles.append(register_first(root, "forward_pre", remember, with_kwargs=True))
            if component:
                self._handles.append(root.register_forward_hook(after_compiled))

        def entry(method: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
            if torch.compiler.is_compiling() or state.busy or state.depth[cname]:
                return method(*args, **kwargs)
            slot.checked = True
            if slot.pending:
                call = slot.pending.pop()
            else:  # forward called directly (module.forward(...)): no hook ran before it
                call = self._record(method, args, kwargs)
            state.depth[cname] += 1
            try:
                with self._lock.read():  # no re-apply changes the weights while it runs
                    call.generation = self._generation
                    output = method(*args, **kwargs)
            except OP_ERRORS as exc:
                state.depth[cname] -= 1
                if not self.applied.active or not self._about_dtypes(exc, call):
                    raise
                return self._dtype_error(cname, root, call, exc)
            except BaseException:
                state.depth[cname] -= 1
                raise
            state.depth[cname] -= 1
            if all_finite(output):
                return output
            return self._handle(cname, root, call, output)

        # Outermost: the guard sees what the policy's own method hooks produce.
        self._handles.append(add_method_hook(root, name, entry, priority=100))

    def _module_check(self, cname: str, name: str):
        def hook(module, args, output):
            if not self._thread.busy and not all_finite(output):
                warnings.warn(f"mixprec guard: {cname}.{name} ({type(module).__name__}) produced non-finite output", stacklevel=2)
        return hook

    def apply_remembered(self) -> dict[str, str]:
        """Pin modules remembered for this model and hardware, where the policy is narrower.

        Logs one INFO line per pin (module, dtype, when it was learned and why).
        """
        entry = self.store.entry(self.fingerprint)
        remembered = entry.get("pins", {})
        plans = {p.qualname: p for p in self.applied.plans}
        wanted = {m: d for m, d in remembered.items() if m in plans and (
            plans[m].output_dtype != "fp32" if d == OUTPUT_FP32 else _ORDER[plans[m].storage] < _ORDER.get(d, -1))}
        if not wanted:
            return {}
        learned = entry.get("learned", {})
        reasons = entry.get("reasons", {})
        pins = [Pin(m, d, "remembered", learned.get(m, entry.get("updated", "unknown")), reasons.get(m, "")) for m, d in wanted.items()]
        self._pin(pins)
        for pin in pins:
            logger.info("mixprec guard: %s pinned to %s, remembered from a fallback learned %s%s (fallback store %s)",
                        pin.module, pin.dtype, pin.learned, f": {pin.reason}" if pin.reason else "", self.store.path)
        return wanted

    def _pin(self, pins: list[Pin]) -> None:
        # A bare model is the component "": its whole-model scope is every module ("*").
        def rule(p: Pin) -> Rule:
            match, reason = _exact(p.module) if p.module else "*", f"guard {p.source}: {p.module} -> {p.dtype}" + (
                f" ({p.reason})" if p.reason else "")
            if p.dtype == OUTPUT_FP32:
                return Rule(match, output_dtype="fp32", reason=reason)
            return Rule(match, storage=p.dtype, keep_fp32=p.dtype == "fp32" or None, reason=reason)

        rules = tuple(rule(p) for p in pins)
        self._reapply(self.applied.policy.with_rules(*rules))
        self.pins.update({p.module: p for p in pins})

    def _learn(self, module: str | list[str], dtype: str, reason: str) -> Any:
        """Pin ``module`` (or each of a list, returned as a list) to ``dtype``, in one re-apply."""
        learned = time.strftime("%Y-%m-%d %H:%M:%S")
        pins = [Pin(m, dtype, "fallback", learned, reason) for m in ([module] if isinstance(module, str) else module)]
        self._pin(pins)
        return pins[0] if isinstance(module, str) else pins

    def _remember(self, pins: list[Pin]) -> bool:
        """Write the pins to the store; a store that cannot be written costs the memory, never the call."""
        if not self.remember:
            return False
        try:
            for pin in pins:
                self.store.remember(self.fingerprint, pin.module, pin.dtype, description=", ".join(self.applied.components),
                                    reason=pin.reason)
        except OSError as exc:
            warnings.warn(f"mixprec guard: the fallback worked, but it could not be remembered in {self.store.path} "
                          f"({type(exc).__name__}: {exc}); it holds for this process only. Set MIXPREC_CACHE_DIR to a "
                          "writable folder, or pass guard(..., store=FallbackStore(path)) or remember=False", stacklevel=4)
            return False
        return True

    def remove(self) -> None:
        """Remove the guard's hooks and method wrappers (pins stay in the applied policy)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    # -- localisation --------------------------------------------------------------------
    def _rerun(self, call: RecordedCall) -> Any:
        with self._lock.read():
            call.restore()
            call.generation = self._generation
            busy, self._thread.busy = self._thread.busy, True
            try:
                return call.fn(*call.args, **call.kwargs)
            finally:
                self._thread.busy = busy

    def _record(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> RecordedCall:
        call = RecordedCall.record(fn, args, kwargs)
        call.generation = self._generation
        return call

    def _reapply(self, policy: Any) -> None:
        """Swap in ``policy`` once no other thread is inside a guarded call; new calls wait meanwhile."""
        with self._lock.write():
            self.applied.reapply(policy)
            self._generation += 1

    @contextlib.contextmanager
    def _exclusive(self) -> Any:
        """One fallback at a time; this thread's own calls in progress do not block the others'."""
        with self._lock.parked():
            self._fallbacks.acquire()
        try:
            yield
        finally:
            self._fallbacks.release()

    def localise(self, cname: str, root: nn.Module, call: RecordedCall) -> OverflowReport:
        """Re-run one component call with per-module hooks; name the first bad module."""
        return localise_overflow(cname, root, self.applied.plans, lambda: self._rerun(call))

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

    def _handle(self, cname: str, root: nn.Module, call: RecordedCall, output: Any) -> Any:
        # The input first: NaN in, NaN out is no module's fault, and widening cannot fix it.
        for label, value in [*((f"argument {i}", a) for i, a in enumerate(call.args)),
                             *((f"argument {k!r}", v) for k, v in call.kwargs.items())]:
            if not all_finite(value):
                raise NonFiniteInputError(cname or "(root)", label)
        if call.generation != self._generation:
            # Another thread widened the policy while this call ran: run it again on the
            # weights now in force before blaming (or pinning) anything for it.
            output = self._rerun(call)
            if all_finite(output):
                return output
        report = self.localise(cname, root, call)
        self.reports.append(report)
        if self.on_nonfinite == "raise":
            raise NonFiniteError(report)
        if self.on_nonfinite == "warn":
            warnings.warn(f"mixprec guard: non-finite output: {report}", stacklevel=2)
            return output
        with self._exclusive():
            if call.generation != self._generation:  # a fallback on another thread finished meanwhile
                output = self._rerun(call)
                if all_finite(output):
                    return output
                report = self.localise(cname, root, call)
                self.reports.append(report)
            return self._fallback(cname, root, call, report)

    def _fallback(self, cname: str, root: nn.Module, call: RecordedCall, report: OverflowReport) -> Any:
        first = report
        pins: list[Pin] = []
        for _ in range(12):  # each round pins one scope one step wider
            step = self._next_step(report)
            if step is None:
                raise NonFiniteError(report, "fallback exhausted: nothing left to widen"
                                     + (f"; tried {', '.join(f'{p.module} -> {p.dtype}' for p in pins)}" if pins else ""))
            scope, dtype = step
            pins.append(self._learn(scope, dtype, f"non-finite output: {report.reason} in {report.module}"))
            output = self._rerun(call)
            if all_finite(output):
                remembered = self._remember(pins)
                warnings.warn(f"mixprec guard: {first}; pinned {', '.join(f'{p.module} -> {p.dtype}' for p in pins)} and re-ran the call"
                              + ("; remembered for the next start" if remembered else ""), stacklevel=3)
                return output
            report = self.localise(cname, root, call)
            self.reports.append(report)
        raise NonFiniteError(report, f"fallback gave up after {len(pins)} changes: {', '.join(f'{p.module} -> {p.dtype}' for p in pins)}")

    def _about_dtypes(self, exc: BaseException, call: RecordedCall) -> bool:
        """Whether the call failed on dtypes: by torch's wording, or else by what happened: a
        re-run in which each failing op is retried with its inputs in one dtype gets past it
        (:class:`WidenMode`); the op it rescued is kept for the report."""
        if is_dtype_error(exc):
            return True
        return may_be_about_dtypes(exc) and self._probe(call)

    def _probe(self, call: RecordedCall) -> bool:
        """Re-run ``call`` under :class:`WidenMode`: whether an op got past its failure with its
        inputs in one dtype; that op, and the modules whose 16-bit tensors it read, go on ``call``."""
        seen: list = []
        read: list = []
        try:
            with WidenMode(seen, read):
                self._rerun(call)
        except Exception:  # noqa: BLE001 - what decides is whether an op was rescued before it
            pass
        if seen:  # whose weights, named now: a re-apply casts them into new storage
            call.rescued, call.read = seen[0], weight_owners(read[0], self.applied.plans)
        return bool(seen)

    def _dtype_error(self, cname: str, root: nn.Module, call: RecordedCall, exc: BaseException) -> Any:
        """A dtype error inside a call: name the module; with ``fallback``, pin the narrowest scope that works."""
        if call.rescued is None:
            self._probe(call)  # which op, and whose weights it read (torch's wording said "dtypes")
        report = locate(exc, cname, root, self.applied.plans, self.applied.policy, rescued=call.rescued)
        self.reports.append(report)
        if self.on_nonfinite != "fallback":
            raise PrecisionDtypeError(report) from exc
        with self._exclusive():
            if call.generation != self._generation:  # a fallback on another thread finished meanwhile
                try:
                    output = self._rerun(call)
                except OP_ERRORS as again:
                    if not self._still_dtypes(again, exc, call):
                        raise
                else:
                    return output if all_finite(output) else self._handle(cname, root, call, output)
            return self._dtype_fallback(cname, root, call, exc, report)

    def _still_dtypes(self, again: BaseException, first: BaseException, call: RecordedCall) -> bool:
        """Whether a re-run under a fallback failed on dtypes too (the same failure, or another clash)."""
        return (type(again) is type(first) and str(again) == str(first)) or self._about_dtypes(again, call)

    def _dtype_fallback(self, cname: str, root: nn.Module, call: RecordedCall, exc: BaseException,
                        report: DtypeErrorReport) -> Any:
        start = self.applied.policy
        pins_before = dict(self.pins)
        output = self._widen_outputs(report, call, exc, start, pins_before)
        if output is not _FAILED:
            return output if all_finite(output) else self._handle(cname, root, call, output)
        tried: list[str] = []
        owners = call.read or []
        for scope in candidate_scopes(report, self.applied.plans, owners):
            # The module that failed (or whose weights the failing op read), with its
            # counterparts in every other module of the failing module's class: they run
            # the same code, so they fail the same way (one pass, not one per layer).
            same = counterparts(scope, report.module, root, self.applied.plans) if (
                scope == report.module or scope in owners) else [scope]
            pins = self._learn(same, "fp32", f"dtype error in {report.type}.{report.method}: {report.error}")
            try:
                output = self._rerun(call)
            except OP_ERRORS as again:
                if not self._still_dtypes(again, exc, call):
                    self._unpin(start, pins_before)
                    raise
                tried.append(scope)
                self._unpin(start, pins_before)
                continue
            remembered = self._remember(pins)
            others = f" and the {len(pins) - 1} other {report.type} module(s) of {cname or 'the model'}" if len(pins) > 1 else ""
            warnings.warn(f"mixprec guard: {report}; pinned {scope}{others} -> fp32 and re-ran the call"
                          + (f" (widening {', '.join(tried)} alone did not help)" if tried else "")
                          + ("; remembered for the next start" if remembered else ""), stacklevel=4)
            if not all_finite(output):
                return self._handle(cname, root, call, output)
            return output
        # Not even fp32 everywhere the error could come from helps: the model's own error.
        raise add_note(exc, f"mixprec guard: this call fails the same way with {', '.join(tried) or 'the component'} in fp32, "
                            "so it is the model's own error, not a precision problem; the policy was left as it was")

    def _widen_outputs(self, report: DtypeErrorReport, call: RecordedCall, exc: BaseException, start: Any,
                       pins_before: dict[str, Pin]) -> Any:
        """The surgical fix for an op in a module's own code that mixes a 16-bit activation with
        a tensor of its own: hand it the wider dtype where the activation left the last 16-bit
        module that code called, before any module is pinned to fp32. Returns the re-run's
        output, or :data:`_FAILED` when widening no single callee's output helps."""
        tried = []
        for scope in direct_callees(report, self.applied.plans, lambda: self._rerun(call)):
            pin = self._learn(scope, OUTPUT_FP32, f"its 16-bit output met another dtype in {report.type}.{report.method}: "
                                                  f"{report.error}")
            try:
                output = self._rerun(call)
            except OP_ERRORS as again:
                self._unpin(start, pins_before)
                if not self._still_dtypes(again, exc, call):
                    raise
                tried.append(scope)
                continue
            remembered = self._remember([pin])
            warnings.warn(f"mixprec guard: {report}; handed on the output of {scope} in fp32 (it computes as before) and "
                          "re-ran the call" + ("; remembered for the next start" if remembered else ""), stacklevel=5)
            return output
        return _FAILED

    def _unpin(self, policy: Any, pins: dict[str, Pin]) -> None:
        self._reapply(policy)
        self.pins = dict(pins)


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
        hardware: the probe result (default: :func:`mixprec.device.hardware.probe`, cached).
        remember: store fallbacks on disk and re-apply remembered ones now.
        store: where to remember (default: ``fallbacks.json`` in the mixprec cache dir).

    Examples:
        >>> applied = mixprec.apply(pipe, mixprec.preset("memory"))
        >>> g = mixprec.guard(applied, on_nonfinite="fallback")

    Besides non-finite outputs, the guard handles dtype errors raised inside a call
    (mismatched dtypes, an op without a 16-bit kernel): ``raise`` turns them into a
    :class:`PrecisionDtypeError` naming the module, its dtypes, the rule and the
    keep-fp32 rule to add; ``fallback`` first tries handing on the output of one module the
    failing code called in fp32 (pin ``fp32-output``: the module still computes in 16
    bits), then pins the narrowest scope to fp32 that makes the call succeed, re-runs it
    and remembers the pin. A call that fails the same way with
    everything in fp32 is the model's own error and is re-raised unchanged.
    """
    if not isinstance(applied, Applied):
        raise TypeError(f"guard() needs what mixprec.apply() returned, got {type(applied).__name__}")
    refuse_context("mixprec.guard")
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
