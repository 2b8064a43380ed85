"""Per-module numerics profile: range, headroom, underflow, own and inherited error.

``profile(target, inputs, policy)`` runs the target twice on the same inputs:

1. in fp32 (the original weights), recording per module the absmax of its inputs and
   outputs, its fp16 headroom (absmax / 65,504), and the fraction of its non-zero
   output values that fall below the smallest normal number of fp16 and of bf16
   (they underflow to subnormals or zero); for every module that owns weights and
   that the policy stores or computes in 16 bits it also runs a copy of the module,
   weights rounded to the storage dtype and arithmetic in the compute dtype (bf16
   weights with fp32 compute have an error too), on the fp32 module's own input, and
   compares with the fp32 output: the module's **own error**, as SQNR in dB;
   Enclosing blocks and components get an own error too: a copy of the whole block,
   each of its modules stored and computed as the policy says, run on the block's fp32
   input. An error that only appears when sibling layers combine (cancellation between
   branches, residual sums, normalisation statistics) shows at the block that holds
   them even when each layer's own error is ordinary;
2. under the policy, comparing each module's output with the fp32 run's output at the
   same call: the **inherited error**, everything upstream included.

Both runs see the same random draws: the global generators (torch's CPU one and those
of initialised CUDA devices, Python's ``random``, NumPy's) are set to the same state
before each run, an own-error copy draws what its module drew and leaves the run's
generators where they were, and the caller's state is restored at the end. Draws made
in 16 bits (``randn_like`` of a bf16 activation) are made in fp32 and rounded
(:class:`_WideDraws`): torch 2.13 gives exactly those values itself, but torch 2.6's CPU
kernels draw other ones for fp16 / bf16, which would pair noise with unrelated noise. Each run
gets its own deep copy of ``inputs``: models that cast their inputs in place, or a
``torch.Generator`` passed in them, would otherwise differ between the runs, and the
caller's inputs stay untouched.

Modules called several times per run (decoding loops, shared blocks) are profiled per
call and summarised per module with the call count: the largest absmax and the worst
(lowest) SQNR over its calls. Calls are paired by (module, call index) only when the
module was called as many times in both runs, with outputs of the same shapes;
otherwise ``pairing_mismatch`` says why, and the inherited error is left out rather
than computed between unrelated calls. ``int_inputs_differ`` marks a module whose
integer or boolean inputs (token ids, masks, lengths) differed between the runs at a
paired call: its inherited error starts from different inputs, not just from rounding.
Outputs are compared on a fixed strided sample of at most 65,536 values per call, so
memory stays bounded on large activations.

The result is a :class:`~mixprec.diagnose.profile_result.Profile`; the copies that
measure own error are :class:`~mixprec.diagnose.low_copy.LowCopy`.
"""

from __future__ import annotations

import copy
import logging
import math
import random
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from mixprec.casting.apply import apply
from mixprec.casting.fp8plan import Fp8Plan
from mixprec.casting.hooks import register_first
from mixprec.casting.kinds import stored_elements
from mixprec.casting.targets import components_of, refuse_context, refuse_tensors
from mixprec.diagnose.capture import (absmax, cast_owned, first_float, fresh_inputs, int_fingerprint, sample, shared_model_memo,
                                      snapshot)
from mixprec.diagnose.low_copy import LowCopy
from mixprec.diagnose.overflow import NonFiniteInputError, all_finite, first_nonfinite
from mixprec.diagnose.profile_result import ModuleStats, Profile
from mixprec.diagnose.progress import Meter, ProfileProgress, log_progress
from mixprec.policy import ModulePlan, Policy, resolve_modules

__all__ = ["profile", "sqnr_db"]

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


def _owns_weights(module: nn.Module) -> bool:
    return any(p is not None and p.is_floating_point() for p in module._parameters.values())


def _is_reduced(plan: ModulePlan) -> bool:
    """The policy rounds this module's weights or runs it in 16 bits."""
    return plan.storage != "fp32" or plan.compute_dtype != "fp32"


class _RngState:
    """The global random generators' state: torch CPU, initialised CUDA devices, ``random``, NumPy."""

    __slots__ = ("cpu", "cuda", "python", "numpy")

    def __init__(self) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        self.python = random.getstate()
        np = sys.modules.get("numpy")
        self.numpy = np.random.get_state() if np is not None else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        random.setstate(self.python)
        if self.numpy is not None:
            sys.modules["numpy"].random.set_state(self.numpy)


_HALF = (torch.float16, torch.bfloat16)
_FACTORIES = dict.fromkeys((torch.randn, torch.rand))
_LIKE = dict.fromkeys((torch.randn_like, torch.rand_like))
_FROM_TENSORS = dict.fromkeys((torch.normal, torch.bernoulli))
_IN_PLACE = dict.fromkeys((torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.bernoulli_, torch.Tensor.exponential_))


class _WideDraws(TorchFunctionMode):
    """While active, random draws in fp16 / bf16 are made in fp32 and rounded to their dtype."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "out" in kwargs:
            return func(*args, **kwargs)
        if func in _FACTORIES or func in _LIKE:
            like = (args[0] if args else kwargs.get("input")) if func in _LIKE else None
            dtype = kwargs.get("dtype") or (like.dtype if like is not None else torch.get_default_dtype())
            if dtype in _HALF:
                return func(*args, **{**kwargs, "dtype": torch.float32}).to(dtype)
        elif func in _FROM_TENSORS:
            half = [a.dtype for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.dtype in _HALF]
            if kwargs.get("dtype") in _HALF:  # torch.normal(0.0, 1.0, size, dtype=torch.bfloat16)
                return func(*args, **{**kwargs, "dtype": torch.float32}).to(kwargs["dtype"])
            if half and kwargs.get("dtype") is None:
                up = [a.float() if isinstance(a, torch.Tensor) and a.dtype in _HALF else a for a in args]
                return func(*up, **{k: (v.float() if isinstance(v, torch.Tensor) and v.dtype in _HALF else v)
                                    for k, v in kwargs.items()}).to(half[0])
        elif func in _IN_PLACE and args and isinstance(args[0], torch.Tensor) and args[0].dtype in _HALF:
            wide = torch.empty_like(args[0], dtype=torch.float32)
            func(wide, *args[1:], **kwargs)
            return args[0].copy_(wide)
        return func(*args, **kwargs)


@dataclass
class _Call:
    index: int
    args: Any = None
    kwargs: Any = None
    rng: _RngState | None = None


def _default_runner(target: Any) -> Callable[[Any], Any]:
    if hasattr(target, "run"):
        return target.run
    if isinstance(target, nn.Module):
        return lambda inputs: target(*inputs) if isinstance(inputs, tuple) else target(inputs)
    raise TypeError("profile() needs a pipeline, an nn.Module, or run= for a mapping of components")


def _output_sqnr(low: Any, reference: tuple[tuple[int, ...], torch.Tensor] | None) -> float | None:
    y = first_float(low)
    if y is None or reference is None or tuple(y.shape) != reference[0]:
        return None
    return sqnr_db(sample(y), reference[1])


def profile(target: Any, inputs: Any, policy: Policy, *, run: Callable[[Any], Any] | None = None,
            blocks: bool = True, progress: Callable[[ProfileProgress], None] | None = None,
            clock: Callable[[], float] = time.monotonic) -> Profile:
    """Profile every module of ``target`` on ``inputs`` in fp32 and under ``policy``.

    Args:
        target: a pipeline, an ``nn.Module`` or a mapping of components (then give ``run``).
        inputs: what the pipeline's ``run`` (or the module) takes; each run gets a deep
            copy, so the caller's inputs are never changed.
        policy: the precision policy whose 16-bit choices are profiled.
        run: how to run the target on inputs (default: ``target.run`` or ``target(inputs)``).
            It need not seed itself: both runs start from the same random state, and the
            caller's random state is restored afterwards.
        blocks: also measure the own error of every block and component that holds a
            layer the policy rounds (a copy of the block on its fp32 input). Costs a
            run of each block per call; copies are kept for reuse up to half the
            model's fp32 weight bytes, larger ones are made per call.
        progress: called with a :class:`~mixprec.diagnose.progress.ProfileProgress`
            (phase, module calls done of the total, about how long is left) at most
            once a second of ``clock``; to know the totals, one plain fp32 run counts the
            module calls first. Without it, a line goes to the ``mixprec`` logger every
            30 seconds when that logs at INFO.

    Returns:
        A :class:`Profile`.

    Raises:
        NonFiniteInputError: ``inputs`` hold inf or NaN; the input is bad, not the precision
            (a module whose input turns non-finite during the fp32 run is marked
            ``input_nonfinite`` instead, and never suggested).

    Examples:
        >>> prof = mixprec.profile(pipe, pipe.example_inputs(1, 0), mixprec.preset("memory"))
        >>> print(prof.suggestions_toml())
    """
    refuse_context("mixprec.profile")
    comps, _ = components_of(target)
    refuse_tensors(comps)
    bad = first_nonfinite(inputs)
    if bad is not None:
        raise NonFiniteInputError(", ".join(name or "(root)" for name in comps), f"the profiled inputs, at {bad}")
    runner = run or _default_runner(target)
    plans, _ = resolve_modules(comps, policy)
    by_id = {id(p.module): p for p in plans}
    stats: dict[int, ModuleStats] = {}
    for plan in plans:
        stats[id(plan.module)] = ModuleStats(plan.qualname or "(root)", plan.type_name, plan.storage, plan.compute_dtype)
    layers = {id(p.module) for p in plans if _is_reduced(p) and _owns_weights(p.module)}
    block_ids = {id(p.module) for p in plans if blocks and not _owns_weights(p.module)
                 and any(id(sub) in layers for sub in p.module.modules())}
    lowable = layers | block_ids
    fp8_read = Fp8Plan(comps, plans, policy).read
    for plan in plans:
        stats[id(plan.module)].owns_weights = _owns_weights(plan.module)
    copies: dict[int, LowCopy] = {}
    # Block copies are kept up to half the model's fp32 weight bytes; beyond that, made per call.
    copy_budget = [sum(stored_elements(t) * 4 for root in comps.values() for t in root.parameters() if t.is_floating_point()) // 2]
    model_memo = shared_model_memo(comps) if block_ids else {}
    hook_ids: set[int] = set()

    reference: dict[tuple[int, int], tuple[tuple[int, ...], torch.Tensor]] = {}
    int_prints: dict[tuple[int, int], tuple] = {}
    counters: dict[int, int] = {}
    stacks: dict[int, list[_Call]] = {}

    def fp32_pre(module, args, kwargs):
        key = id(module)
        s = stats[key]
        index = counters.get(key, 0)
        counters[key] = index + 1
        s.calls += 1
        # Read the input before the forward runs: it may change it in place.
        s.input_absmax = _nanmax(s.input_absmax, absmax(first_float((args, kwargs))))
        s.input_nonfinite = s.input_nonfinite or not all_finite((args, kwargs))
        int_prints[(key, index)] = int_fingerprint((args, kwargs))
        call = _Call(index)
        if key in block_ids:
            # A block may hand stateful objects down (a KV cache it appends to): its copy
            # gets its own deep copy of them, the model's modules and weights shared.
            try:
                call.args, call.kwargs = copy.deepcopy((args, kwargs), dict(model_memo))
                call.rng = _RngState()
            except Exception as exc:  # an input deepcopy cannot copy: this call gets no own error
                s.own_skipped = f"its inputs could not be copied ({type(exc).__name__}: {exc})"[:200]
        elif key in lowable:
            call.args, call.kwargs, call.rng = snapshot(args), snapshot(kwargs), _RngState()
        stacks.setdefault(key, []).append(call)

    def fp32_post(module, args, kwargs, output):
        if meter is not None:
            meter.tick()
        key = id(module)
        s = stats[key]
        call = stacks[key].pop()
        y = first_float(output)
        if y is None:
            return
        s.output_absmax = _nanmax(s.output_absmax, absmax(y))
        nonzero = y.detach()[y.detach() != 0].abs().float()
        if nonzero.numel():
            s.underflow_fp16 = max(s.underflow_fp16, float((nonzero < _TINY["fp16"]).float().mean()))
            s.underflow_bf16 = max(s.underflow_bf16, float((nonzero < _TINY["bf16"]).float().mean()))
        reference[(key, call.index)] = (tuple(y.shape), sample(y))
        if key not in lowable or call.rng is None:
            return
        low_copy = copies.get(key)
        if low_copy is None:
            low_copy = LowCopy(module, by_id[key], by_id, hook_ids, fp8_read)
            if key in layers or low_copy.nbytes <= copy_budget[0]:
                copies[key] = low_copy
                copy_budget[0] -= low_copy.nbytes if key in block_ids else 0
        # The copy draws what the module drew (same random state as at its call) and
        # leaves the run's generators where the module left them.
        after = _RngState()
        call.rng.restore()
        try:
            if key in block_ids:
                # its own copies of stateful inputs (a KV cache) hold what the policy would: cast them too
                cast_owned((call.args, call.kwargs), low_copy.compute, low_copy.min_ndim)
            try:
                low = first_float(low_copy(call.args, call.kwargs))
            except Exception as exc:  # reported on the module (an op without a 16-bit kernel); the run goes on
                s.own_skipped = f"its {by_id[key].compute_dtype} copy failed on the fp32 input ({type(exc).__name__}: {exc})"[:300]
                return
        finally:
            after.restore()
        if low is not None and low.shape == y.shape:
            s.own_nonfinite = s.own_nonfinite or not (math.isfinite(float(low.amax())) and math.isfinite(float(low.amin())))
            own = sqnr_db(low.float(), y.float())
            s.own_sqnr_db = own if s.own_sqnr_db is None else min(s.own_sqnr_db, own)

    report = progress if progress is not None else (log_progress() if logging.getLogger("mixprec").isEnabledFor(logging.INFO)
                                                    else None)
    meter = Meter(report, clock=clock) if report is not None else None
    if meter is not None:
        meter.start("counting module calls (one plain fp32 run)", 0)
        total, plain_s = _count_calls(plans, runner, inputs, comps, clock)
        meter.start("fp32 pass and own errors", total, later_s=2 * plain_s)
        low_total = total
    caller_rng = _RngState()
    handles = []
    try:
        try:
            for plan in plans:
                handles.append(plan.module.register_forward_pre_hook(fp32_pre, with_kwargs=True))
                handles.append(plan.module.register_forward_hook(fp32_post, with_kwargs=True))
            hook_ids.update(h.id for h in handles)
            with torch.inference_mode(), _WideDraws():
                fp32_out = runner(fresh_inputs(inputs, comps))
        finally:
            for h in handles:
                h.remove()
            handles.clear()
            copies.clear()
            stacks.clear()
        out_reference = (tuple(y.shape), sample(y)) if (y := first_float(fp32_out)) is not None else None

        low_counts: dict[int, int] = {}
        low_stacks: dict[int, list[int]] = {}
        values: dict[int, list[float]] = {}
        shape_mismatch: dict[int, str] = {}
        int_differ: set[int] = set()
        fresh = fresh_inputs(inputs, comps)
        low_inputs = target.teacher_forced(fresh, fp32_out) if hasattr(target, "teacher_forced") else fresh

        # prepend: see what the caller passed and what the module computed, before a
        # boundary casts them.
        def low_pre(module, args, kwargs):
            key = id(module)
            index = low_counts.get(key, 0)
            low_counts[key] = index + 1
            low_stacks.setdefault(key, []).append(index)
            expected = int_prints.get((key, index))
            if expected is not None and key not in int_differ and int_fingerprint((args, kwargs)) != expected:
                int_differ.add(key)

        def low_post(module, args, output):
            if meter is not None:
                meter.tick()
            key = id(module)
            index = low_stacks[key].pop()
            y = first_float(output)
            if y is None:
                return
            ref = reference.get((key, index))
            if ref is None or tuple(y.shape) != ref[0]:
                if key not in shape_mismatch:
                    fp32_shape = "no floating output" if ref is None else f"shape {tuple(ref[0])}"
                    shape_mismatch[key] = (f"call {index}: {fp32_shape} in fp32, shape {tuple(y.shape)} under the policy")
                return
            values.setdefault(key, []).append(sqnr_db(sample(y), ref[1]))

        if meter is not None:
            meter.start("pass under the policy", low_total)
        with apply(target if not isinstance(target, dict) else comps, policy):
            try:
                for plan in plans:
                    handles.append(register_first(plan.module, "forward_pre", low_pre, with_kwargs=True))
                    handles.append(register_first(plan.module, "forward", low_post))
                caller_rng.restore()  # the random state the fp32 run started from
                with torch.inference_mode(), _WideDraws():
                    low_out = runner(low_inputs)
            finally:
                for h in handles:
                    h.remove()
    finally:
        caller_rng.restore()

    for key, s in stats.items():
        s.policy_calls = low_counts.get(key, 0)
        if s.policy_calls != s.calls:
            s.pairing_mismatch = f"called {s.calls} times in fp32, {s.policy_calls} under the policy"
        elif key in shape_mismatch:
            s.pairing_mismatch = shape_mismatch[key]
        else:
            if values.get(key):
                s.inherited_sqnr_db = min(values[key])
            s.int_inputs_differ = key in int_differ
    modules = [stats[id(p.module)] for p in plans if stats[id(p.module)].calls or stats[id(p.module)].policy_calls]
    return Profile(policy, modules, output_sqnr_db=_output_sqnr(low_out, out_reference))


def _count_calls(plans: list[ModulePlan], runner: Callable[[Any], Any], inputs: Any, comps: dict[str, nn.Module],
                 clock: Callable[[], float]) -> tuple[int, float]:
    """Module calls of one plain fp32 run, and its seconds; the random state is put back after it."""
    calls = [0]

    def count(module, args):
        calls[0] += 1

    before = _RngState()
    handles = [plan.module.register_forward_pre_hook(count) for plan in plans]
    start = clock()
    try:
        with torch.inference_mode(), _WideDraws():
            runner(fresh_inputs(inputs, comps))
    finally:
        for h in handles:
            h.remove()
        before.restore()
    return calls[0], clock() - start


def _nanmax(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)
