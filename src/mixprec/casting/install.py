"""Where an applied policy's forward wrappers go: casts at component and module boundaries
where compute dtypes differ, compute from weights stored in another dtype (fp32 from 16-bit,
bf16 from fp8), leaf casts, keep-fp32 pins,
entry gates, and upcast-attention and spectral scopes.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import nn

from mixprec.casting.fp8 import pin_fp8
from mixprec.casting.fp32compute import ComputeIn, stored_elsewhere
from mixprec.casting.frames import inline_only
from mixprec.casting.meet import DtypeMeet
from mixprec.casting.prune import Pruner
from mixprec.casting.hooks import (AppEntry, Boundary, EntryBoundary, EntryGate, LeafCast, UpcastScope, add_method_hook, cast_floats,
                                   first_float_dtype, own_tensors, pin_fp32)
from mixprec.casting.spectral import SpectralScope, uses_spectral_ops
from mixprec.casting.targets import DTYPES
from mixprec.casting.upcast import is_attention_module, sdpa_upcast_table
from mixprec.policy.tree import called_children, entry_methods, is_container, is_torch_layer
from mixprec.policy import ModulePlan, Policy

__all__ = ["install_wrappers", "install_pins", "policy_matches_directly"]


def _dtype_fn(plan: ModulePlan, by_module: dict[int, ModulePlan]) -> Callable[[], torch.dtype]:
    """The dtype a module computes in, read at call time so it follows a later ``.half()``.

    The representative is the first floating parameter in the module's subtree that
    was planned in the same dtype (not one inside a keep-fp32 island).
    """
    if plan.compute_dtype == "fp32":
        return lambda: torch.float32
    planned = DTYPES[plan.compute_dtype]
    same = [sub for sub in plan.module.modules()
            if (sub_plan := by_module.get(id(sub))) is not None and sub_plan.compute_dtype == plan.compute_dtype]
    # Parameters keep their identity through module.half() / .to(); buffers are replaced. An
    # fp8-stored weight (or one a compute rule converts per call) is not stored in the compute dtype.
    for sub in same:
        rep = next((p for p in sub._parameters.values() if p is not None and p.is_floating_point() and p.dtype == planned), None)
        if rep is not None:
            return lambda: rep.dtype
    return lambda: planned


def _owns_float_weights(module: nn.Module) -> bool:
    """Own floating parameters, or (for a leaf) own floating buffers such as running stats."""
    if any(p is not None and p.is_floating_point() for p in module._parameters.values()):
        return True
    return not module._modules and any(b is not None and b.is_floating_point() for b in module._buffers.values())


def install_wrappers(comps: dict[str, nn.Module], by_module: dict[int, ModulePlan], policy: Policy,
                     entry_dtypes: dict[str, torch.dtype], handles: list[Any], pinned: list[nn.Module]) -> None:
    """Install the wrappers and keep-fp32 pins of ``by_module`` on ``comps``.

    Each handle and pinned module is appended as soon as it is installed, so that the
    applied policy's revert removes what a failure half-way left behind.
    """
    inline_only()  # under torch.compile these hooks are inlined or run eagerly, never compiled alone
    for cname, root in comps.items():
        first_handle = len(handles)
        gate = EntryGate()
        # A component without any 16-bit module gets no per-module casts at all.
        mixed = any(by_module[id(m)].storage != "fp32" or by_module[id(m)].compute_dtype != "fp32" for m in root.modules())
        # The caller of a module: its nearest ancestor that is called. A ModuleList or
        # ModuleDict is never called, so a boundary on it would never fire; its children
        # get their boundaries as if they hung from the container's own parent.
        parent_of: dict[int, nn.Module | None] = {id(root): None}
        upcast_scoped: set[int] = set()
        sdpa_table = None
        for name, module in root.named_modules():
            container = is_container(module)
            for child in module.children():
                parent_of.setdefault(id(child), parent_of[id(module)] if container else module)
            plan = by_module[id(module)]
            if plan.keep_fp32 and any(True for _ in own_tensors(module)):
                pin_fp32(module)
                pinned.append(module)
            elif pin_fp8(module):
                pinned.append(module)
            if container:
                continue
            parent = parent_of.get(id(module))
            parent_plan = by_module[id(parent)] if parent is not None else None
            layer = is_torch_layer(module)

            is_root = parent is None
            differs = parent_plan is not None and parent_plan.compute_dtype != plan.compute_dtype
            bounded = is_root or differs or bool(plan.output_dtype)
            if bounded:
                out_fixed = DTYPES[plan.output_dtype] if plan.output_dtype else None
                parent_dtype = _dtype_fn(parent_plan, by_module) if parent_plan is not None else None
                boundary = Boundary(
                    module,
                    _dtype_fn(plan, by_module),
                    (lambda f=out_fixed: f) if (out_fixed or parent_dtype is None) else parent_dtype,
                    min_ndim=0 if layer else 2,
                    fallback=entry_dtypes[cname] if is_root else None,
                    gate=None if is_root else gate,
                )
                if is_root:
                    handles.append(add_method_hook(module, "forward", boundary.around))
                else:
                    handles.append(module.register_forward_pre_hook(boundary.pre, with_kwargs=True))
                    handles.append(module.register_forward_hook(boundary.post, with_kwargs=True, always_call=True))

            # A module reading weights stored in another dtype computes from copies; so may a block
            # of such a plan without weights of its own (it may read its children's, as torch's
            # TransformerEncoderLayer hands its attention's weights to one fused kernel).
            compute = DTYPES[plan.compute_dtype]
            if not plan.keep_fp32 and (any(stored_elsewhere(t, compute) for _, t in own_tensors(module)) or (
                    plan.storage != plan.compute_dtype and not _owns_float_weights(module) and module._modules)):
                handles.append(ComputeIn(compute, min_ndim=0 if compute == torch.float32 or layer else 2).install(module))
            elif mixed and not bounded and _owns_float_weights(module):
                handles.append(LeafCast(_dtype_fn(plan, by_module), 0 if layer else 2).install(module))

            if plan.upcast_attention and id(parent) not in upcast_scoped:
                direct = plan.decided_by.get("upcast_attention") is not None and policy_matches_directly(policy, plan)
                if is_attention_module(module) or (direct and not any(is_attention_module(m) for m in module.modules())):
                    if sdpa_table is None:
                        sdpa_table = sdpa_upcast_table({p.device.type for p in root.parameters()} or {"cpu"})
                    handles.append(add_method_hook(module, "forward", UpcastScope(sdpa_table).around))
                    upcast_scoped.add(id(module))
            if id(parent) in upcast_scoped:
                upcast_scoped.add(id(module))  # already inside a scope: no nested one

        if mixed:
            _install_spectral_scopes(root, handles)
            # Components used through their own methods (S3Gen.inference, vae.decode) hand
            # the caller its own dtype back, as a call of forward does.
            back = functools.partial(_return_caller_dtype, entry_dtypes[cname])
            for method in entry_methods(root)[1:]:
                handles.append(add_method_hook(root, method, back))
            # Where the component's tensors meet tensors of another dtype in an op that
            # cannot take both, the call runs again with such ops in the wider dtype.
            for method in entry_methods(root):
                handles.append(add_method_hook(root, method, DtypeMeet(root, cname, method).around, priority=50))

        handles.extend(gate.install(root))
        children = list(called_children(root))
        for child in children:
            handles.append(EntryBoundary(child, _dtype_fn(by_module[id(child)], by_module), gate).install())
        if mixed:
            _install_app_entries(root, {id(c) for c in children}, gate, entry_dtypes[cname], handles)
            # Apps also enter a component through its direct children (whisper.decode calls
            # model.encoder and model.decoder itself): such a call that fails on dtypes runs
            # again as a call of the component's own methods does. Called from the component's
            # module code, the failure is the enclosing entry's to re-run.
            names = {id(m): n for n, m in root.named_modules()}
            for child in children:
                for method in entry_methods(child):
                    meet = DtypeMeet(root, cname, f"{names[id(child)]}.{method}")
                    handles.append(add_method_hook(child, method, functools.partial(_from_app_code, gate, meet.around),
                                                   priority=50))
        # Per-module wrappers that the first calls show never change a dtype come off. The
        # direct children's entries stay: the app calls them from outside any component call.
        wrappers = [h for h in handles[first_handle:] if isinstance(h, (LeafCast, AppEntry))]
        if wrappers:
            pruner = Pruner(wrappers)
            for method in entry_methods(root):
                handles.append(add_method_hook(root, method, pruner.around, priority=40))


def install_pins(comps: dict[str, nn.Module], by_module: dict[int, ModulePlan], pinned: list[nn.Module]) -> None:
    """Only the keep-fp32 pins: for a policy that changes no dtype anywhere (every tensor already
    in its planned dtype, everything computed in fp32, no upcast scope), where any wrapper
    could only cost (a boundary on every component entry measured 2 to 10% of a small
    model's call)."""
    for root in comps.values():
        for module in root.modules():
            plan = by_module[id(module)]
            if plan.keep_fp32 and any(True for _ in own_tensors(module)):
                pin_fp32(module)
                pinned.append(module)


def _install_app_entries(root: nn.Module, direct: set[int], gate: EntryGate, fallback: torch.dtype,
                         handles: list[Any]) -> None:
    """Where the app's own code (a component method's body) can call a module, that module
    hands back the caller's dtype (:class:`AppEntry`).

    Every module's own methods (``vocoder.decode``) are such places, and so is the
    ``forward`` of every module with children, at any depth. Leaf layers deep inside a
    component and the direct children (whose :class:`EntryBoundary` already does it)
    get no forward wrapper: that keeps the cost to one check per block call.
    """
    for module in root.modules():
        if module is root or is_container(module):
            continue
        entry = AppEntry(gate, fallback)
        if module._modules and id(module) not in direct:
            handles.append(entry.install(module))
        for name in entry_methods(module)[1:]:
            handles.append(add_method_hook(module, name, entry.around))


def _from_app_code(gate: EntryGate, hook: Callable[..., Any], call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """``hook`` around a call the app's own code made (no module code of the component
    running on this thread); a plain call where the component's module code made it."""
    if gate.depth:
        return call(*args, **kwargs)
    return hook(call, args, kwargs)


def _return_caller_dtype(fallback: torch.dtype, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    caller = first_float_dtype((args, kwargs)) or fallback
    return cast_floats(call(*args, **kwargs), caller)


def _install_spectral_scopes(root: nn.Module, handles: list[Any]) -> None:
    """FFT / STFT / complex ops get fp32 inputs inside modules whose code uses them.

    The topmost such module of each subtree gets the scope on ``forward`` (hooks) and on
    its other public methods (``inference``, ``decode``: method hooks, removed on revert).
    """
    scoped: set[int] = set()
    for module in root.modules():
        if id(module) in scoped:
            scoped.update(id(m) for m in module.children())
            continue
        if is_container(module) or not uses_spectral_ops(module):
            continue
        scope = SpectralScope()
        handles.append(module.register_forward_pre_hook(scope.pre))
        handles.append(module.register_forward_hook(scope.post, always_call=True))
        for name in entry_methods(module)[1:]:
            handles.append(add_method_hook(module, name, scope.around))
        if module is not root:
            scoped.update(id(m) for m in module.children())


def policy_matches_directly(policy: Policy, plan: ModulePlan) -> bool:
    index = plan.decided_by["upcast_attention"]
    return any(policy.rules[index].matches(name, plan.module) for name in (plan.qualname, *plan.aliases))
