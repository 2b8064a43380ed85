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
generators where they were, and the caller's state is restored at the end. Each run
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
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import random
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from mixprec.casting.apply import DTYPES, apply, components_of
from mixprec.casting.hooks import cast_floats
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
    #: Calls in the run under the policy (``calls`` counts the fp32 run).
    policy_calls: int = 0
    #: Why this module's calls could not be paired between the runs (call counts or
    #: output shapes differ); ``inherited_sqnr_db`` is then ``None``.
    pairing_mismatch: str | None = None
    #: Its integer/bool tensor inputs (token ids, masks) differed between the runs at
    #: a paired call: its inherited error starts from different inputs.
    int_inputs_differ: bool = False
    #: It owns floating-point parameters itself (a layer); ``False`` for a block or
    #: component whose own error comes from the layers inside it.
    owns_weights: bool = False
    #: Why a block's own error was not measured (its inputs could not be copied).
    own_skipped: str | None = None

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
    #: SQNR of the target's output under the policy against the fp32 output (first
    #: floating tensor of each), or ``None`` when there is none or their shapes differ.
    output_sqnr_db: float | None = None

    def by_risk(self) -> list[ModuleStats]:
        """Modules that overflow fp16 first, then by lowest own error SQNR (a layer before the
        block holding it on a tie, so an overflow is named where it happens), then by headroom."""
        def key(s: ModuleStats):
            own = s.own_sqnr_db if s.own_sqnr_db is not None else math.inf
            return (not s.overflows_fp16, own, not s.owns_weights, -s.fp16_headroom)

        return sorted(self.modules, key=key)

    def rows(self) -> list[dict[str, Any]]:
        """Plain rows (JSON-safe: infinities become strings) for tables and the benchmark store."""
        return [{k: _json_safe(v) for k, v in s.to_dict().items()} for s in self.by_risk()]

    def to_json(self) -> str:
        return json.dumps({"policy": self.policy.to_dict(), "output_sqnr_db": _json_safe(self.output_sqnr_db),
                           "modules": self.rows()}, indent=2)

    def suggestions(self, *, min_own_sqnr_db: float = 20.0) -> list[dict[str, Any]]:
        """Keep-fp32 rules that would fix the risky modules: fp16 overflow, or own SQNR below the bound.

        Layers are suggested by their own error. A block is suggested only when its
        own error is below the bound while no layer inside it is (the error comes from
        their combination), so a block never repeats what one of its layers explains.
        """
        out = []
        for s in self.by_risk():
            if s.compute == "fp32" and s.storage == "fp32":
                continue
            if not s.owns_weights:
                reason = self._block_reason(s, min_own_sqnr_db)
                if reason is not None:
                    out.append({"match": s.module, "keep_fp32": True, "reason": reason})
                continue
            if s.own_nonfinite:
                reason = f"its {s.compute} copy produces inf/NaN on the fp32 input (overflow inside the module)"
            elif s.overflows_fp16 and "fp16" in (s.compute, s.storage):
                reason = f"absmax {s.output_absmax:.4g} exceeds fp16's {FP16_MAX:.0f}"
            elif s.own_sqnr_db is not None and s.own_sqnr_db < min_own_sqnr_db:
                where = s.compute if s.storage == s.compute else f"{s.storage} storage, {s.compute} compute"
                reason = f"own error {s.own_sqnr_db:.1f} dB SQNR in {where} (< {min_own_sqnr_db:g} dB)"
            else:
                continue
            out.append({"match": s.module, "keep_fp32": True, "reason": reason})
        return out

    def _block_reason(self, block: ModuleStats, min_own_sqnr_db: float) -> str | None:
        own = block.own_sqnr_db
        if own is None or not own < min_own_sqnr_db:
            return None
        root = block.module == "(root)"
        inside = [s for s in self.modules if s is not block and s.own_sqnr_db is not None
                  and (root or s.module.startswith(block.module + "."))]
        if any(s.own_sqnr_db < min_own_sqnr_db or s.own_nonfinite for s in inside):
            return None  # a layer (or a smaller block) inside explains it and is suggested itself
        best = min((s.own_sqnr_db for s in inside), default=math.inf)
        return (f"own error {own:.1f} dB SQNR as a block (< {min_own_sqnr_db:g} dB) while every module inside "
                f"stays at {best:.1f} dB or better: the error comes from how they combine")

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


def _children(obj: Any) -> list[Any]:
    """What a module argument or output holds: tuple/list items, dict values, dataclass fields."""
    if isinstance(obj, (tuple, list)):
        return list(obj)
    if isinstance(obj, dict):
        return list(obj.values())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
    return []


def _first_float(obj: Any, depth: int = 0) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj if obj.is_floating_point() else None
    if depth > 8:
        return None
    for v in _children(obj):
        found = _first_float(v, depth + 1)
        if found is not None:
            return found
    return None


def _int_fingerprint(obj: Any) -> tuple[tuple[tuple[int, ...], int], ...]:
    """(shape, checksum) of every integer/bool tensor inside ``obj``, in traversal order."""
    prints: list[tuple[tuple[int, ...], int]] = []

    def walk(o: Any, depth: int) -> None:
        if isinstance(o, torch.Tensor):
            if not (o.is_floating_point() or o.is_complex()):
                flat = o.detach().reshape(-1)
                step = max(1, math.ceil(flat.numel() / _SAMPLE))
                values = flat[::step].to(torch.int64)
                weights = torch.arange(values.numel(), device=values.device, dtype=torch.int64) % 65521 + 1
                prints.append((tuple(o.shape), int((values * weights).sum())))
            return
        if depth <= 8:
            for child in _children(o):
                walk(child, depth + 1)

    walk(obj, 0)
    return tuple(prints)


def _snapshot(obj: Any, depth: int = 0) -> Any:
    """A copy of the tensors inside ``obj`` (containers rebuilt, other objects shared).

    A module may change its input in place during its forward (``x.mul_()``, in-place
    activations); the own-error copy must see the input as the module received it,
    and must not change the run's tensors.
    """
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if depth > 8:
        return obj
    if isinstance(obj, (tuple, list)):
        items = [_snapshot(o, depth + 1) for o in obj]
        if isinstance(obj, list):
            return items
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, dict):
        copied = copy.copy(obj)
        for key in list(obj.keys()):
            copied[key] = _snapshot(obj[key], depth + 1)
        return copied
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        copied = copy.copy(obj)
        for f in dataclasses.fields(obj):
            if hasattr(obj, f.name):
                object.__setattr__(copied, f.name, _snapshot(getattr(obj, f.name), depth + 1))
        return copied
    return obj


def _absmax(t: torch.Tensor | None) -> float:
    if t is None or t.numel() == 0:
        return 0.0
    return float(t.detach().abs().amax().float())  # NaN if any value is NaN


def _owns_weights(module: nn.Module) -> bool:
    return any(p is not None and p.is_floating_point() for p in module._parameters.values())


def _is_reduced(plan: ModulePlan) -> bool:
    """The policy rounds this module's weights or runs it in 16 bits."""
    return plan.storage != "fp32" or plan.compute_dtype != "fp32"


def _own_tensors(module: nn.Module) -> list[torch.Tensor]:
    return [t for t in list(module._parameters.values()) + list(module._buffers.values()) if t is not None]


_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
                "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")


class _LowCopy:
    """A private copy of a module (and its subtree) as the policy stores and computes it.

    Every floating parameter and buffer is rounded to its module's storage dtype and
    kept there; for the call each module's tensors are cast to that module's compute
    dtype (bf16 storage with fp32 compute: rounded weights, fp32 arithmetic), as are
    the floating inputs. Inside a block, a module computing in another dtype than its
    parent gets its inputs cast to its dtype and its outputs cast back to its parent's.
    """

    def __init__(self, module: nn.Module, plan: ModulePlan, plans: dict[int, ModulePlan], hook_ids: set[int]):
        def plan_of(original: nn.Module, parent: ModulePlan) -> ModulePlan:
            return plans.get(id(original)) or parent

        self.casts: list[tuple[torch.Tensor, torch.dtype]] = []
        with torch.inference_mode(False), torch.no_grad():
            clone = copy.deepcopy(module)
            sub_plans: dict[int, ModulePlan] = {id(clone): plan}
            for (name, original), sub in zip(module.named_modules(), clone.modules()):
                for table in _HOOK_TABLES:  # the profile's own hooks were copied along
                    hooks = getattr(sub, table, None)
                    for hook_id in [k for k in hooks if k in hook_ids] if hooks else ():
                        del hooks[hook_id]
                parent = sub_plans.get(id(_parent_of(clone, name)), plan) if name else plan
                own_plan = sub_plans[id(sub)] = plan_of(original, parent) if name else plan
                storage, compute = DTYPES[own_plan.storage], DTYPES[own_plan.compute_dtype]
                for t in _own_tensors(sub):
                    if t.is_floating_point():
                        t.requires_grad_(False)
                        t.data = t.data.to(storage)
                        if compute != storage:
                            self.casts.append((t, compute))
                if name and own_plan.compute_dtype != parent.compute_dtype:
                    sub.register_forward_pre_hook(_cast_inputs(DTYPES[own_plan.compute_dtype], _min_ndim(sub)),
                                                  with_kwargs=True)
                    sub.register_forward_hook(_cast_output(DTYPES[parent.compute_dtype]))
        self.module = clone
        self.compute = DTYPES[plan.compute_dtype]
        self.min_ndim = _min_ndim(module)
        self.nbytes = sum(t.numel() * t.element_size() for sub in clone.modules() for t in _own_tensors(sub))

    def __call__(self, args: Any, kwargs: Any) -> Any:
        saved = []
        for t, dtype in self.casts:
            saved.append((t, t.data))
            t.data = t.data.to(dtype)
        try:
            return self.module(*cast_floats(args, self.compute, min_ndim=self.min_ndim),
                               **cast_floats(kwargs, self.compute, min_ndim=self.min_ndim))
        finally:
            for t, data in saved:
                t.data = data


def _min_ndim(module: nn.Module) -> int:
    """torch's own layers need every floating input in their dtype; other modules keep
    0-d/1-d floats (timesteps, scales) as they came, as apply's boundaries do."""
    return 0 if type(module).__module__.startswith("torch.nn.") else 2


def _parent_of(root: nn.Module, name: str) -> nn.Module:
    return root.get_submodule(name.rpartition(".")[0]) if "." in name else root


def _cast_inputs(dtype: torch.dtype, min_ndim: int) -> Callable[..., Any]:
    def hook(module: nn.Module, args: Any, kwargs: Any) -> Any:
        return cast_floats(args, dtype, min_ndim=min_ndim), cast_floats(kwargs, dtype, min_ndim=min_ndim)
    return hook


def _cast_output(dtype: torch.dtype) -> Callable[..., Any]:
    def hook(module: nn.Module, args: Any, output: Any) -> Any:
        return cast_floats(output, dtype)
    return hook


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


@dataclass
class _Call:
    index: int
    args: Any = None
    kwargs: Any = None
    rng: _RngState | None = None


def _fresh_inputs(inputs: Any, comps: dict[str, nn.Module]) -> Any:
    """A deep copy of ``inputs`` for one run; the components (and their tensors) stay shared."""
    try:
        return copy.deepcopy(inputs, _model_memo(comps))
    except Exception:  # not copyable: both runs share it
        return inputs


def _cast_owned(obj: Any, dtype: torch.dtype, min_ndim: int, depth: int = 0, seen: set[int] | None = None) -> Any:
    """Cast, in place, the floating tensors held by objects the profile deep-copied for
    itself (containers and plain objects such as a KV cache; modules are left alone).

    Returns ``obj`` or, for a tensor, its cast copy.
    """
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() and obj.dtype != dtype and obj.dim() >= min_ndim else obj
    if depth > 8 or id(obj) in seen or isinstance(obj, (nn.Module, str, bytes, int, float, bool, type)) or obj is None:
        return obj
    seen.add(id(obj))
    if isinstance(obj, list):
        obj[:] = [_cast_owned(v, dtype, min_ndim, depth + 1, seen) for v in obj]
    elif isinstance(obj, tuple):
        for v in obj:  # a tuple cannot change: cast inside what it holds (its tensors stay)
            _cast_owned(v, dtype, min_ndim, depth + 1, seen)
    elif isinstance(obj, dict):
        for k in list(obj):
            obj[k] = _cast_owned(obj[k], dtype, min_ndim, depth + 1, seen)
    elif hasattr(obj, "__dict__"):
        for k, v in list(vars(obj).items()):
            new = _cast_owned(v, dtype, min_ndim, depth + 1, seen)
            if new is not v:
                try:
                    setattr(obj, k, new)
                except (AttributeError, TypeError):  # a read-only attribute keeps its value
                    pass
    return obj


def _model_memo(comps: dict[str, nn.Module]) -> dict[int, Any]:
    """A ``copy.deepcopy`` memo that keeps the components' modules and tensors shared."""
    memo: dict[int, Any] = {}
    for root in comps.values():
        for module in root.modules():
            memo[id(module)] = module
            for t in _own_tensors(module):
                memo[id(t)] = t
    return memo


def _default_runner(target: Any) -> Callable[[Any], Any]:
    if hasattr(target, "run"):
        return target.run
    if isinstance(target, nn.Module):
        return lambda inputs: target(*inputs) if isinstance(inputs, tuple) else target(inputs)
    raise TypeError("profile() needs a pipeline, an nn.Module, or run= for a mapping of components")


def _output_sqnr(low: Any, reference: tuple[tuple[int, ...], torch.Tensor] | None) -> float | None:
    y = _first_float(low)
    if y is None or reference is None or tuple(y.shape) != reference[0]:
        return None
    return sqnr_db(_sample(y), reference[1])


def profile(target: Any, inputs: Any, policy: Policy, *, run: Callable[[Any], Any] | None = None,
            blocks: bool = True) -> Profile:
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

    Returns:
        A :class:`Profile`.

    Example:
        >>> prof = mixprec.profile(pipe, pipe.example_inputs(1, 0), mixprec.preset("memory"))
        >>> print(prof.suggestions_toml())
    """
    comps, _ = components_of(target)
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
    for plan in plans:
        stats[id(plan.module)].owns_weights = _owns_weights(plan.module)
    copies: dict[int, _LowCopy] = {}
    # Block copies are kept up to half the model's fp32 weight bytes; beyond that, made per call.
    copy_budget = [sum(t.numel() * 4 for root in comps.values() for t in root.parameters() if t.is_floating_point()) // 2]
    model_memo = _model_memo(comps) if block_ids else {}
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
        s.input_absmax = _nanmax(s.input_absmax, _absmax(_first_float((args, kwargs))))
        int_prints[(key, index)] = _int_fingerprint((args, kwargs))
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
            call.args, call.kwargs, call.rng = _snapshot(args), _snapshot(kwargs), _RngState()
        stacks.setdefault(key, []).append(call)

    def fp32_post(module, args, kwargs, output):
        key = id(module)
        s = stats[key]
        call = stacks[key].pop()
        y = _first_float(output)
        if y is None:
            return
        s.output_absmax = _nanmax(s.output_absmax, _absmax(y))
        nonzero = y.detach()[y.detach() != 0].abs().float()
        if nonzero.numel():
            s.underflow_fp16 = max(s.underflow_fp16, float((nonzero < _TINY["fp16"]).float().mean()))
            s.underflow_bf16 = max(s.underflow_bf16, float((nonzero < _TINY["bf16"]).float().mean()))
        reference[(key, call.index)] = (tuple(y.shape), _sample(y))
        if key not in lowable or call.rng is None:
            return
        low_copy = copies.get(key)
        if low_copy is None:
            low_copy = _LowCopy(module, by_id[key], by_id, hook_ids)
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
                _cast_owned((call.args, call.kwargs), low_copy.compute, low_copy.min_ndim)
                try:
                    low = _first_float(low_copy(call.args, call.kwargs))
                except Exception as exc:  # reported on the block; the layers inside keep their own errors
                    s.own_skipped = f"its {by_id[key].compute_dtype} copy failed on the fp32 input ({type(exc).__name__}: {exc})"[:300]
                    return
            else:
                low = _first_float(low_copy(call.args, call.kwargs))
        finally:
            after.restore()
        if low is not None and low.shape == y.shape:
            s.own_nonfinite = s.own_nonfinite or not (math.isfinite(float(low.amax())) and math.isfinite(float(low.amin())))
            own = sqnr_db(low.float(), y.float())
            s.own_sqnr_db = own if s.own_sqnr_db is None else min(s.own_sqnr_db, own)

    caller_rng = _RngState()
    handles = []
    try:
        try:
            for plan in plans:
                handles.append(plan.module.register_forward_pre_hook(fp32_pre, with_kwargs=True))
                handles.append(plan.module.register_forward_hook(fp32_post, with_kwargs=True))
            hook_ids.update(h.id for h in handles)
            with torch.inference_mode():
                fp32_out = runner(_fresh_inputs(inputs, comps))
        finally:
            for h in handles:
                h.remove()
            handles.clear()
            copies.clear()
            stacks.clear()
        out_reference = (tuple(y.shape), _sample(y)) if (y := _first_float(fp32_out)) is not None else None

        low_counts: dict[int, int] = {}
        low_stacks: dict[int, list[int]] = {}
        values: dict[int, list[float]] = {}
        shape_mismatch: dict[int, str] = {}
        int_differ: set[int] = set()
        fresh = _fresh_inputs(inputs, comps)
        low_inputs = target.teacher_forced(fresh, fp32_out) if hasattr(target, "teacher_forced") else fresh

        # prepend: see what the caller passed and what the module computed, before a
        # boundary casts them.
        def low_pre(module, args, kwargs):
            key = id(module)
            index = low_counts.get(key, 0)
            low_counts[key] = index + 1
            low_stacks.setdefault(key, []).append(index)
            expected = int_prints.get((key, index))
            if expected is not None and key not in int_differ and _int_fingerprint((args, kwargs)) != expected:
                int_differ.add(key)

        def low_post(module, args, output):
            key = id(module)
            index = low_stacks[key].pop()
            y = _first_float(output)
            if y is None:
                return
            ref = reference.get((key, index))
            if ref is None or tuple(y.shape) != ref[0]:
                if key not in shape_mismatch:
                    fp32_shape = "no floating output" if ref is None else f"shape {tuple(ref[0])}"
                    shape_mismatch[key] = (f"call {index}: {fp32_shape} in fp32, shape {tuple(y.shape)} under the policy")
                return
            values.setdefault(key, []).append(sqnr_db(_sample(y), ref[1]))

        with apply(target if not isinstance(target, dict) else comps, policy):
            try:
                for plan in plans:
                    handles.append(plan.module.register_forward_pre_hook(low_pre, with_kwargs=True, prepend=True))
                    handles.append(plan.module.register_forward_hook(low_post, prepend=True))
                caller_rng.restore()  # the random state the fp32 run started from
                with torch.inference_mode():
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


def _nanmax(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)
