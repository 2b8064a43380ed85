"""Forward hooks that carry a policy out: boundary casts, fp32 compute, upcast scopes, pins.

Each hook object is small and stateless apart from a per-call stack (so re-entrant
and recursive calls pair up correctly); :mod:`mixprec.casting.apply` decides where they go.
Those stacks, and the :class:`EntryGate` depth, belong to the calling thread: one
applied model called from several threads pairs each thread's calls on its own.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import threading
from typing import Any, Callable, Iterable

import torch
from torch import nn

from mixprec._kv_cache import current_names
from mixprec.casting.frames import own_code
from mixprec.casting.upcast import UpcastAttentionMode

__all__ = [
    "AppEntry", "Boundary", "EntryGate", "EntryBoundary", "ForwardWrapper", "LeafCast", "UpcastScope", "pin_fp32", "cast_floats", "own_tensors",
    "add_method_hook", "MethodHookHandle", "first_float_dtype", "CallStack", "compiling", "register_first",
]


#: Whether torch.compile is tracing (torch >= 2.3; where torch cannot tell, assume it is).
compiling: Callable[[], bool] = getattr(torch.compiler, "is_compiling", lambda: True)


def own_tensors(module: nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    """(``"p:name"`` / ``"b:name"``, tensor) for the module's own parameters and buffers."""
    yield from ((f"p:{n}", p) for n, p in module._parameters.items() if p is not None)
    yield from ((f"b:{n}", b) for n, b in module._buffers.items() if b is not None)


def cast_floats(obj: Any, dtype: torch.dtype, *, min_ndim: int = 0) -> Any:
    """Cast floating tensors inside ``obj`` to ``dtype``, never changing ``obj`` itself.

    Tensors, tuples (named tuples included), lists, dicts (``ModelOutput`` and other
    dict subclasses included) and dataclass instances (``T3Cond``-style conditioning
    objects) are walked. A container in which something is cast comes back as a new
    container; one in which nothing needs casting comes back as the same object, so
    the common case allocates nothing. The caller's objects are never mutated.
    """
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() and obj.dtype != dtype and obj.dim() >= min_ndim:
            return obj.to(dtype)
        return obj
    if isinstance(obj, (tuple, list)):
        items = [cast_floats(o, dtype, min_ndim=min_ndim) for o in obj]
        if all(new is old for new, old in zip(items, obj)):
            return obj  # nothing to cast: no new container on every call
        if isinstance(obj, list):
            return items
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, dict):
        changed = {}
        for key, value in obj.items():
            new = cast_floats(value, dtype, min_ndim=min_ndim)
            if new is not value:
                changed[key] = new
        if not changed:
            return obj
        if type(obj) is dict:
            return {**obj, **changed}
        if dataclasses.is_dataclass(obj):
            # transformers' ModelOutput: rebuilt through its constructor, which torch.compile
            # traces (copy.copy of it breaks the graph); it keeps its type and field order.
            return type(obj)(**{**obj, **changed})
        copied = copy.copy(obj)  # other dict subclasses keep their type
        for key, value in changed.items():
            copied[key] = value
        return copied
    # ``obj is not None`` first: torch 2.6's Dynamo cannot trace is_dataclass(None) when the
    # None is a traced call's result (a model method returning nothing breaks the graph).
    if obj is not None and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changed = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name, None)
            new = cast_floats(value, dtype, min_ndim=min_ndim)
            if new is not value:
                changed[f.name] = new
        if not changed:
            return obj
        copied = copy.copy(obj)
        for name, value in changed.items():
            object.__setattr__(copied, name, value)  # frozen dataclasses too
        return copied
    return obj


class CallStack(threading.local):
    """A stack of per-call entries that belongs to the calling thread.

    Hooks push on entering a module and pop on leaving it; calls of the same model
    on another thread see their own stack, never this one's entries.
    """

    def __init__(self) -> None:
        self.items: list[Any] = []

    def __reduce__(self) -> tuple[Any, tuple]:
        return type(self), ()  # a copy of a model has no calls in progress


def first_float_dtype(obj: Any) -> torch.dtype | None:
    if isinstance(obj, torch.Tensor):
        return obj.dtype if obj.is_floating_point() else None
    if isinstance(obj, (tuple, list)):
        values: Iterable[Any] = obj
    elif isinstance(obj, dict):
        values = obj.values()
    else:
        return None
    for value in values:
        found = first_float_dtype(value)
        if found is not None:
            return found
    return None


@dataclasses.dataclass
class Boundary:
    """Casts at the edge of a module whose compute dtype differs from its caller's."""

    module: nn.Module
    compute: Callable[[], torch.dtype]
    output: Callable[[], torch.dtype | None]
    #: (caller's dtype, entered from app code) per call in progress on this thread.
    calls: CallStack = dataclasses.field(default_factory=CallStack, repr=False)
    #: 0-d and 1-d floats (timesteps, sigmas, scales) are scalars to most modules and
    #: lose meaning in 16 bits (t=999 rounds to 1000 in bf16): they pass unchanged,
    #: except into torch's own layers, whose kernels need every input in their dtype.
    min_ndim: int = 2
    #: What to hand back when the caller passed no floating tensor (token ids only):
    #: the dtype the model had before the policy, so callers never get 16-bit surprises.
    fallback: torch.dtype | None = None
    #: The component's :class:`EntryGate`: called from the app's own code (a component
    #: method's body), the module hands back the caller's dtype, not its parent's, as
    #: type promotion would have in fp32.
    gate: Any = None

    @property
    def caller_dtypes(self) -> list[tuple[torch.dtype | None, bool]]:
        return self.calls.items

    def pre(self, module, args, kwargs):
        self.caller_dtypes.append((first_float_dtype((args, kwargs)), self.gate is not None and self.gate.outside))
        dtype = self.compute()
        return cast_floats(args, dtype, min_ndim=self.min_ndim), cast_floats(kwargs, dtype, min_ndim=self.min_ndim)

    def post(self, module, args, kwargs, output):
        caller, from_app = self.caller_dtypes.pop() if self.caller_dtypes else (None, False)
        target = caller if (from_app and caller is not None) else (self.output() or caller or self.fallback)
        return output if target is None else cast_floats(output, target)

    def around(self, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        """The boundary as a method hook on ``forward`` (see :func:`add_method_hook`).

        Used on components: their forward and its casts then form one Python frame,
        which ``torch.compile`` traces as one graph (a forward hook on the module being
        compiled is a frame, and a graph, of its own).
        """
        args, kwargs = self.pre(self.module, args, kwargs)
        try:
            output = call(*args, **kwargs)
        except BaseException:
            if self.caller_dtypes:
                self.caller_dtypes.pop()
            raise
        return self.post(self.module, args, kwargs, output)


def _carry_signature(wrapper: Callable[..., Any], method: Callable[..., Any]) -> None:
    """Give ``wrapper`` the method's own signature, resolved now.

    Code that inspects a method while traced (transformers' ``apply_chunking_to_forward``
    counts its parameters) then stops at the wrapper instead of unwrapping ``__wrapped__``,
    whose ``id()`` of a bound method torch 2.11's Dynamo cannot trace (a graph break).
    """
    try:
        wrapper.__signature__ = inspect.signature(method)
    except (TypeError, ValueError):
        pass  # a builtin without a signature: inspect unwraps as it would without mixprec


class ForwardWrapper:
    """A hook installed as the module's ``forward`` instance attribute.

    A module with any forward hook leaves torch's fast call path; a wrapper does not,
    and ``torch.compile`` traces it with the forward it wraps as one frame. Subclasses
    build the wrapper and call :meth:`_set`; :meth:`remove` restores what was there and
    leaves the wrapper inert if someone wrapped ``forward`` again on top of it.

    No ``__slots__`` here or in subclasses: torch < 2.7's Dynamo reads a slot only when
    the instance's own class declares it (``active`` declared here, read on a ``LeafCast``,
    broke the graph at every wrapped module).
    """

    def _set(self, module: nn.Module, wrapper: Callable[..., Any], forward: Callable[..., Any]) -> None:
        own_code(wrapper, f"mixprec_{type(self).__name__}_{type(module).__name__}_forward")
        functools.update_wrapper(wrapper, forward)  # inspect.signature(module.forward) stays the model's
        _carry_signature(wrapper, forward)
        self.module, self.wrapper, self.active = module, wrapper, True
        # What the calls so far showed (read by :class:`~mixprec.casting.prune.Pruner`):
        # ``seen``, called at all; ``needed``, it changed a dtype at least once.
        self.seen = self.needed = self.pruned = False
        module.__dict__["forward"] = wrapper

    def prune(self) -> bool:
        """Take the wrapper off ``forward`` (it is kept, for :meth:`rearm`); only while it
        is the outermost wrapper, so nothing installed on top of it is lost."""
        if not self.active or self.pruned or self.module.__dict__.get("forward") is not self.wrapper:
            return False
        if self.previous is None:
            del self.module.__dict__["forward"]
        else:
            self.module.__dict__["forward"] = self.previous
        self.pruned = True
        return True

    def rearm(self) -> None:
        """Put a pruned wrapper back, where ``forward`` is still what pruning left."""
        if self.pruned and self.active and self.module.__dict__.get("forward") is self.previous:
            self.module.__dict__["forward"] = self.wrapper
        self.pruned = False

    def remove(self) -> None:
        self.active = False
        if self.module.__dict__.get("forward") is self.wrapper:
            if self.previous is None:
                del self.module.__dict__["forward"]
            else:
                self.module.__dict__["forward"] = self.previous


class LeafCast(ForwardWrapper):
    """Inputs of a module that owns weights arrive in the dtype it computes in.

    Boundaries only see what crosses a module's edge through ``__call__``. Real models
    also create tensors inside a parent's forward (``torch.sin`` of a phase, noise from
    ``randn_like``), carry them in dataclasses, or cast them to ``self.dtype`` in their
    own code. Whatever the path, the kernel that finally uses a weight needs its input
    in the weight's compute dtype; this sits on each module that owns floating weights
    and casts only what differs.

    It wraps the module's ``forward`` as an instance attribute rather than adding a
    forward pre-hook: a module with any hook leaves torch's fast call path, which costs
    about three times more per call than this wrapper's check (measured on small
    ``Linear`` layers, ``benchmarks/bench_leaf_casts.py``). The common case, every
    input already in the right dtype, allocates nothing.
    """

    def __init__(self, compute: Callable[[], torch.dtype], min_ndim: int):
        self.compute = compute
        self.min_ndim = min_ndim
        self.active = False

    def install(self, module: nn.Module) -> LeafCast:
        """Wrap ``module.forward``; returns ``self``, whose :meth:`remove` undoes it."""
        self.module, self.previous = module, module.__dict__.get("forward")
        forward = module.forward
        compute, min_ndim = self.compute, self.min_ndim

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self.active:
                if not compiling():  # (traced, it would be a side effect replayed after every compiled call)
                    self.seen = True
                dtype = compute()
                if not kwargs:
                    # Plain tensors already in the right dtype: decide without walking
                    # containers or building anything.
                    for a in args:
                        if not isinstance(a, torch.Tensor):
                            if isinstance(a, (tuple, list, dict)) or (a is not None and dataclasses.is_dataclass(a)):
                                break
                        elif a.dtype != dtype and a.is_floating_point() and a.dim() >= min_ndim:
                            break
                    else:
                        return forward(*args)
                cast_args = cast_floats(args, dtype, min_ndim=min_ndim)
                cast_kwargs = cast_floats(kwargs, dtype, min_ndim=min_ndim) if kwargs else kwargs
                if not compiling() and (cast_args is not args or cast_kwargs is not kwargs):
                    self.needed = True  # (Dynamo cannot trace ``is not`` on tuples; nothing is pruned there)
                args, kwargs = cast_args, cast_kwargs
            return forward(*args, **kwargs)

        self._set(module, wrapper, forward)
        return self


class EntryGate(threading.local):
    """Whether a component's module code is running, or only the app's own code, on this thread.

    Components are often used through other methods (``vae.decode``,
    ``MusicDCAE.decode``) whose bodies are app code: they call children directly, hand
    their outputs to library functions (``torchaudio.functional.resample``) and mix
    them with tensors of their own. ``depth`` counts the module calls of this component
    in progress that entered from app code (the component's own ``forward``, and any
    :class:`EntryBoundary` or :class:`AppEntry` that fired); at depth 0 only app code runs.
    The depth is the calling thread's own (a ``threading.local``): another thread's call
    in progress never makes this one's app code look like module code.
    """

    def __init__(self) -> None:
        self.depth = 0

    def __reduce__(self) -> tuple[Any, tuple]:
        return type(self), ()  # a copy of a model has no calls in progress

    def enter(self, module, args):
        self.depth += 1

    def leave(self, module, args, output):
        self.depth -= 1

    @property
    def outside(self) -> bool:
        return self.depth == 0

    def install(self, root: nn.Module) -> list[Any]:
        return [register_first(root, "forward_pre", self.enter),
                root.register_forward_hook(self.leave, always_call=True)]


class EntryBoundary(ForwardWrapper):
    """A root-style boundary on a direct child, active only when entered from app code.

    Called from the component's module code (the usual case) it only reads the gate.
    Called from the app's own code, it casts the inputs to the child's compute dtype and
    hands the outputs back in the caller's dtype, counting as module code meanwhile.
    It wraps ``forward`` as :class:`LeafCast` does (no hook, torch's fast call path stays).
    """

    def __init__(self, module: nn.Module, compute: Callable[[], torch.dtype], gate: EntryGate):
        self.boundary = Boundary(module, compute, lambda: None)
        self.gate, self.active = gate, False

    def install(self) -> EntryBoundary:
        """Wrap ``forward`` of the module; returns ``self``, whose :meth:`remove` undoes it."""
        module = self.boundary.module
        self.previous = module.__dict__.get("forward")
        forward, gate, boundary = module.forward, self.gate, self.boundary

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not compiling():  # what the pruner reads; nothing is pruned in compiled code
                self.seen = True
            if gate.depth or not self.active:
                return forward(*args, **kwargs)
            if not compiling():
                self.needed = True
            gate.depth += 1
            try:
                return boundary.around(forward, args, kwargs)
            finally:
                gate.depth -= 1

        self._set(module, wrapper, forward)
        return self


class AppEntry(ForwardWrapper):
    """Any module of a component called from the app's code hands back the caller's dtype.

    App code inside a component's own methods reaches modules at any depth
    (``self.vocoder.decode(mel)``, ``self.backbone.head(x)``) and then mixes what they
    return with its own fp32 tensors (a resampling kernel, a window, ``torch.zeros``).
    Called while :class:`EntryGate` says no module code of the component runs, this
    returns floating outputs in the dtype of the first floating input (the dtype they
    would have had in fp32: the model's own dtype where only ids were passed), and counts
    as module code while it runs, so only the outermost call casts. Called from module
    code (the usual case) it only reads the gate.

    :meth:`around` serves as a method hook for the module's own methods (``decode``,
    ``inference``); :meth:`install` wraps ``forward`` the way :class:`LeafCast` does
    (no forward hook, so torch's fast call path stays).
    """

    def __init__(self, gate: EntryGate, fallback: torch.dtype):
        self.gate, self.fallback, self.active = gate, fallback, False

    def around(self, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        gate = self.gate
        if gate.depth:
            return call(*args, **kwargs)
        if not compiling():
            self.needed = True  # entered from app code: what it hands back matters
        caller = first_float_dtype((args, kwargs)) or self.fallback
        gate.depth += 1
        try:
            output = call(*args, **kwargs)
        finally:
            gate.depth -= 1
        return cast_floats(output, caller)

    def install(self, module: nn.Module) -> AppEntry:
        """Wrap ``module.forward``; returns ``self``, whose :meth:`remove` undoes it."""
        self.module, self.previous = module, module.__dict__.get("forward")
        forward, gate = module.forward, self.gate

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not compiling():  # what the pruner reads; nothing is pruned in compiled code
                self.seen = True
            if gate.depth or not self.active:
                return forward(*args, **kwargs)
            return self.around(forward, args, kwargs)

        self._set(module, wrapper, forward)
        return self


def register_first(module: nn.Module, kind: str, hook: Callable[..., Any], *, with_kwargs: bool = False) -> Any:
    """Register a forward (``kind="forward"``) or forward pre-hook (``"forward_pre"``) that runs
    before the module's other hooks; returns its handle.

    torch's ``prepend=True`` moves the new key to the front of the hooks' ``OrderedDict``, so
    that its order differs from the order of the dict underneath; Dynamo before torch 2.13
    traces hooks in one order and guards on positions in the other, and fails while building
    guards (pytorch#160083). Here the dict is rebuilt with the hook first, in place (handles
    keep working): both orders agree.
    """
    register = getattr(module, f"register_{kind}_hook")
    handle = register(hook, with_kwargs=with_kwargs) if with_kwargs else register(hook)
    hooks = getattr(module, f"_{kind}_hooks")
    rest = [(key, value) for key, value in hooks.items() if key != handle.id]
    hooks.clear()
    hooks[handle.id] = hook
    hooks.update(rest)
    return handle


_METHOD_TABLE = "_mixprec_method_hooks"


class MethodHookHandle:
    """Removes one around-hook added by :func:`add_method_hook`."""

    def __init__(self, module: nn.Module, name: str, entry: tuple[int, int, Callable[..., Any]]):
        self.module, self.name, self.entry = module, name, entry

    def remove(self) -> None:
        table = self.module.__dict__.get(_METHOD_TABLE)
        if not table or self.name not in table:
            return
        hooks, wrapper, previous = table[self.name]
        if self.entry in hooks:
            hooks.remove(self.entry)
        if not hooks:
            del table[self.name]
            if self.module.__dict__.get(self.name) is wrapper:
                if previous is None:
                    del self.module.__dict__[self.name]
                else:
                    self.module.__dict__[self.name] = previous
            if not table:
                del self.module.__dict__[_METHOD_TABLE]


_order = iter(range(1 << 62))


def add_method_hook(module: nn.Module, name: str, hook: Callable[..., Any], *, priority: int = 0) -> MethodHookHandle:
    """Run ``hook(call, args, kwargs)`` around every call of ``module.<name>``.

    ``call(*args, **kwargs)`` continues with the next hook and finally the method. Hooks
    with a higher ``priority`` are outer (the guard's enclose apply's casts). Unlike
    forward hooks, these also see methods other than ``forward`` (``inference``,
    ``embed_ref``, ``decode``) and direct ``module.forward(...)`` calls. One wrapper is
    installed per method however many hooks share it, so apply and the guard can add
    and remove theirs in any order; the last removal restores the method.
    """
    table = module.__dict__.setdefault(_METHOD_TABLE, {})
    if name not in table:
        previous = module.__dict__.get(name)
        method = getattr(module, name)
        hooks: list[tuple[int, int, Callable[..., Any]]] = []

        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            chain = list(hooks)

            def call(index: int, a: tuple, k: dict) -> Any:
                if index == len(chain):
                    return method(*a, **current_names(method, k))
                return chain[index][2](lambda *a2, **k2: call(index + 1, a2, k2), a, k)

            return call(0, args, kwargs)

        own_code(wrapper, f"mixprec_hooks_{type(module).__name__}_{name}")
        _carry_signature(wrapper, method)
        table[name] = (hooks, wrapper, previous)
        module.__dict__[name] = wrapper
    hooks = table[name][0]
    entry = (-priority, next(_order), hook)
    hooks.append(entry)
    hooks.sort(key=lambda e: (e[0], e[1]))
    return MethodHookHandle(module, name, entry)


class UpcastScope:
    """Attention scores in fp32 while a module's ``forward`` runs (:class:`UpcastAttentionMode`).

    Installed as a method hook on ``forward`` (:meth:`around`), so the mode is left in the
    frame that entered it even when the policy is re-applied during the call (a guard's
    fallback swaps every hook while the failing call is still running: a forward hook
    removed then would never pop the mode it pushed, and every later call in the process
    would upcast).
    """

    def __init__(self, sdpa_upcast: dict[tuple[str, torch.dtype], bool] | None = None) -> None:
        self.sdpa_upcast = sdpa_upcast

    def around(self, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        with UpcastAttentionMode(self.sdpa_upcast):
            return call(*args, **kwargs)


def pin_own(module: nn.Module, own: set[int], keep: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Make ``module._apply`` (``.half()``, ``.to()``) hand each of the tensors ``own`` (by ``id``)
    what ``keep(tensor, converted)`` returns instead of its conversion; revert pops ``_apply``."""
    original = module._apply

    def _apply(fn, *args, **kwargs):
        def converted(t):
            out = fn(t)
            return keep(t, out) if id(t) in own and isinstance(out, torch.Tensor) else out

        return original(converted, *args, **kwargs)

    module._apply = _apply  # type: ignore[method-assign]


def pin_fp32(module: nn.Module) -> None:
    """Make ``module._apply`` keep this module's own floating tensors in fp32."""
    pin_own(module, {id(t) for _, t in own_tensors(module)},
            lambda t, out: out.float() if out.is_floating_point() and out.dtype != torch.float32 else out)


