"""Apply a :class:`~mixprec.policy.Policy` to modules, and take it back bit-exactly.

``apply`` pre-casts weights once (autocast re-casts them on every call and loses at
small batches), inserts casts only at precision boundaries, pins keep-fp32 modules
so that a later ``model.half()`` leaves them alone, and scopes upcast attention to
attention modules. :meth:`Applied.revert` restores every parameter and buffer
(dtype, values, device, ``requires_grad``), removes every hook and patch, and puts
back any global numeric flag the policy changed.
"""

from __future__ import annotations

import functools
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import nn

from mixprec.device import backends
from mixprec.casting.fp32compute import Fp32Compute
from mixprec.casting.hooks import (Boundary, EntryBoundary, EntryGate, LeafCast, UpcastScope, add_method_hook, cast_floats,
                                   first_float_dtype, own_tensors, pin_fp32)
from mixprec.casting.spectral import SpectralScope, uses_spectral_ops
from mixprec.casting.upcast import is_attention_module, sdpa_overflows, sdpa_upcast_table
from mixprec.policy.roles import dtype_property_source
from mixprec.policy.tree import called_children, entry_methods, first_weight_owner, is_container, is_torch_layer
from mixprec.policy import ModulePlan, Policy, PolicyError, closest_names, resolve_modules

__all__ = [
    "apply", "Applied", "ApplyError", "RevertError", "DTYPES", "components_of", "explain", "explain_warnings", "weight_bytes",
    "dtype_read_warnings",
]

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_KEEP_ORIGINAL = ("cpu", "disk", "none")
_WIDTH = {"fp16": 0, "bf16": 1, "fp32": 2}
_MARK = "_mixprec_applied"


class ApplyError(ValueError):
    """The target or the options of ``apply`` are invalid; nothing was changed."""


class RevertError(RuntimeError):
    """``revert`` cannot restore the original weights (``keep_original="none"``)."""


def components_of(target: Any) -> tuple[dict[str, nn.Module], tuple[str, ...]]:
    """Normalise a target to (named components, sensitive hints).

    A bare ``nn.Module`` is one component named ``""`` (module names stay unprefixed);
    a mapping gives its items; a pipeline gives ``pipeline.components`` and its
    ``sensitive`` hints.
    """
    if isinstance(target, nn.Module):
        return {"": target}, ()
    if isinstance(target, Mapping):
        comps = dict(target)
        hints: tuple[str, ...] = ()
        for name, module in comps.items():
            if not isinstance(module, nn.Module):
                raise ApplyError(f"component {name!r} is a {type(module).__name__}, not an nn.Module")
        return comps, hints
    source = getattr(target, "components", None)
    if not isinstance(source, Mapping):
        raise ApplyError(f"cannot apply a policy to {type(target).__name__}: pass an nn.Module, a mapping of named modules, or a pipeline")
    # A pipeline (ours, or a diffusers DiffusionPipeline): its modules are the components;
    # tokenizers, schedulers and absent parts (None) are not models and are left alone.
    comps = {name: module for name, module in source.items() if isinstance(module, nn.Module)}
    if not comps:
        raise ApplyError(f"{type(target).__name__} has no nn.Module components (found: "
                         f"{', '.join(f'{k}={type(v).__name__}' for k, v in source.items()) or 'none'})")
    return comps, tuple(getattr(target, "sensitive", ()) or ())


def weight_bytes(target: Any) -> int:
    """Bytes of all unique parameters and buffers of a target."""
    comps, _ = components_of(target)
    seen: set[int] = set()
    total = 0
    for root in comps.values():
        for t in list(root.parameters()) + list(root.buffers()):
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total


class Applied:
    """A policy applied to a target. Use :meth:`revert`, or ``with mixprec.apply(...)``.

    Attributes:
        policy: the applied policy.
        components: the named components.
        plans: the per-module resolution (see :func:`explain`).
        keep_original: where the original tensors are kept.
        original_bytes: bytes the kept originals cost (RAM for ``cpu``, disk for ``disk``).
    """

    def __init__(self, policy: Policy, components: dict[str, nn.Module], plans: list[ModulePlan], keep_original: str):
        self.policy = policy
        self.components = components
        self.plans = plans
        self.keep_original = keep_original
        self.original_bytes = 0
        self._handles: list[Any] = []
        self._pinned: list[nn.Module] = []
        self._originals: dict[int, tuple[torch.Tensor, Any]] = {}
        # Where each cast tensor lives (module, "p:name" / "b:name"): an app's .half()
        # replaces buffer objects, so revert writes back through the owning module.
        self._locations: dict[int, list[tuple[nn.Module, str]]] = {}
        self._disk: tempfile.TemporaryDirectory | None = None
        self._numerics: backends.Snapshot | None = None
        self._entry_dtypes: dict[str, torch.dtype] = {}
        self._active = True

    @property
    def active(self) -> bool:
        return self._active

    def weight_bytes(self) -> int:
        return weight_bytes(self.components)

    def __enter__(self) -> Applied:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._active:
            self.revert()

    def revert(self) -> None:
        """Restore every parameter and buffer bit-exactly and remove every hook and patch.

        Raises:
            RevertError: when applied with ``keep_original="none"`` (hooks and patches
                are still removed, the cast weights stay).
        """
        if not self._active:
            raise RevertError("this policy was already reverted")
        loaded: dict[str, torch.Tensor] = {}
        if self._disk is not None and self.keep_original != "none":
            # Read the originals back before anything is undone: if they are gone, the
            # model stays applied (and says so) rather than silently keeping 16-bit weights.
            from safetensors.torch import load_file

            path = Path(self._disk.name) / "originals.safetensors"
            try:
                loaded = load_file(str(path))
            except Exception as exc:  # OSError, or safetensors' own error for a damaged file
                raise RevertError(f"cannot read the original weights back from {path} ({type(exc).__name__}: {exc}); "
                                  f"the policy is still applied and nothing was changed; {len(self._originals)} tensors "
                                  "have no other copy: reload the model from its checkpoint") from None
            missing = [key for key in self._originals if str(key) not in loaded]
            if missing:
                raise RevertError(f"{path} lacks {len(missing)} of the {len(self._originals)} original tensors; the policy "
                                  "is still applied and nothing was changed: reload the model from its checkpoint")
        for handle in reversed(self._handles):  # wrappers of one method come off in the order they went on
            handle.remove()
        self._handles.clear()
        for module in self._pinned:
            module.__dict__.pop("_apply", None)
        self._pinned.clear()
        for root in self.components.values():
            for module in root.modules():
                module.__dict__.pop(_MARK, None)
        if self._numerics is not None:
            backends.restore(self._numerics)
        self._active = False
        if self.keep_original == "none":
            raise RevertError(
                "hooks and patches removed, but the original weights were not kept (keep_original='none'); "
                "reload the model, or apply with keep_original='cpu' or 'disk'"
            )
        for key, (tensor, saved) in self._originals.items():
            original, device = (loaded[str(key)], saved) if self._disk is not None else saved
            original = original.to(device)
            tensor.data = original
            for module, slot in self._locations.get(key, ()):
                table = module._parameters if slot.startswith("p:") else module._buffers
                current = table.get(slot[2:])
                if current is not None and current is not tensor:
                    if slot.startswith("p:"):
                        current.data = original
                    else:
                        table[slot[2:]] = tensor
        self._originals.clear()
        self._locations.clear()
        if self._disk is not None:
            self._disk.cleanup()
            self._disk = None

    def original_tensors(self) -> dict[int, torch.Tensor]:
        """The kept originals, by ``id`` of the live tensor (empty with ``keep_original="none"``)."""
        if self._disk is not None:
            from safetensors.torch import load_file

            loaded = load_file(str(Path(self._disk.name) / "originals.safetensors"))
            return {key: loaded[str(key)] for key in self._originals}
        return {key: saved[0] for key, (_, saved) in self._originals.items()}

    def reapply(self, policy: Policy, *, strict: bool = False) -> None:
        """Swap in another policy on the same components, from the original weights.

        The new policy is validated first; the old one is reverted only then. Used by
        the numerics guard to pin an overflowing module to a wider dtype.

        Raises:
            ApplyError: when the originals were not kept (``keep_original="none"``).
        """
        if self.keep_original == "none":
            raise ApplyError("cannot re-apply a policy applied with keep_original='none': the original weights are gone")
        if not isinstance(policy, Policy):
            raise ApplyError(f"policy must be a mixprec Policy, got {type(policy).__name__}")
        plans = _validate(self.components, policy, strict)
        if policy.compile is not None:
            check_compiler(policy.compile, _on_cpu(self.components))
        if self._active:
            self.revert()
        self.policy, self.plans, self.original_bytes = policy, plans, 0
        _materialize(self)

    # The table `mixprec explain` prints.
    def explain(self) -> list[dict[str, Any]]:
        return explain_rows(self.plans, self.policy)

    def warnings(self) -> list[str]:
        """Precision pitfalls of this policy on these modules (see :func:`dtype_read_warnings`)."""
        return dtype_read_warnings(self.plans)


def explain_rows(plans: list[ModulePlan], policy: Policy) -> list[dict[str, Any]]:
    rows = []
    for plan in plans:
        index = plan.decided_by.get("storage")
        rule = policy.rules[index] if index is not None else None
        attention = ""
        if plan.upcast_attention and is_attention_module(plan.module):
            attention = "upcast"
            dtype = DTYPES[plan.compute_dtype]
            if dtype in (torch.float16, torch.bfloat16) and not sdpa_overflows("cpu", dtype):
                attention = "upcast (SDPA path: not needed here, 16-bit SDPA measured finite; only eager paths upcast)"
        if plan.declared is not None:
            rule_text, reason = f"model: {plan.declared}", "the model's own precision declaration"
        else:
            rule_text = f"#{index} {rule.match}" if rule is not None else "default (fp32)"
            reason = rule.reason if rule is not None else ""
        rows.append({
            "module": plan.qualname or "(root)",
            "type": plan.type_name,
            "storage": plan.storage,
            "compute": plan.compute_dtype,
            "keep_fp32": plan.keep_fp32,
            "attention": attention,
            "output_dtype": plan.output_dtype,
            "rule": rule_text,
            "reason": reason,
        })
    return rows


def dtype_read_warnings(plans: list[ModulePlan]) -> list[str]:
    """Where app code that reads a module's dtype sees a dtype the module does not compute in.

    Models commonly define ``self.dtype`` as ``next(self.parameters()).dtype`` and cast
    their inputs to it, sometimes before ops with no 16-bit kernel (``torch.fft``). For
    each component and each module it calls directly, warn when that first parameter is
    stored in a 16-bit type but the module computes in fp32 (``compute="fp32"``): the
    app's code then casts to 16 bits what the policy meant to keep in fp32.
    """
    by_id = {id(p.module): p for p in plans}
    warnings_out: list[str] = []
    for root in (p for p in plans if "." not in p.qualname):
        reads = []
        callees = [by_id[id(m)] for m in called_children(root.module) if id(m) in by_id and m._modules]
        for plan in (root, *callees):
            if plan.compute_dtype != "fp32":
                continue
            own = dtype_property_source(plan.module)  # the model's own dtype property, if any
            if own is not None:
                owner = own[1]
            else:
                owner = first_weight_owner(plan.module)
                if owner is None:
                    continue
            owner_plan = by_id.get(id(owner))
            if owner_plan is not None and owner_plan.storage != "fp32":
                reads.append((plan.qualname or "(root)", owner_plan.qualname or "(root)", owner_plan.storage))
        if reads:
            who = root.qualname or "(root)"
            storage = reads[0][2]
            warnings_out.append(
                f"{who} computes in fp32 from {storage} weights: code that reads a module's dtype from its first "
                f"parameter gets {storage} ({'; '.join(f'{m}.dtype reads {o}' for m, o, _ in reads[:4])}"
                f"{'; ...' if len(reads) > 4 else ''}) and may cast its inputs to it, before ops such as torch.fft that "
                f"have no 16-bit CPU kernel. Keep the module it reads in fp32 (a keep_fp32 rule) or run under "
                "mixprec.guard(applied, on_nonfinite='fallback'), which finds it.")
    return warnings_out


def explain(target: Any, policy: Policy) -> list[dict[str, Any]]:
    """For every module: its resolved storage and compute dtype and the rule that decided it."""
    comps, _ = components_of(target)
    plans, _ = resolve_modules(comps, policy)
    return explain_rows(plans, policy)


def explain_warnings(target: Any, policy: Policy) -> list[str]:
    """What :func:`explain` should warn about for ``policy`` on ``target`` (see :func:`dtype_read_warnings`)."""
    comps, _ = components_of(target)
    plans, _ = resolve_modules(comps, policy)
    return dtype_read_warnings(plans)


def apply(
    target: Any,
    policy: Policy,
    *,
    keep_original: str = "cpu",
    strict: bool = False,
) -> Applied:
    """Apply ``policy`` to a module, a mapping of named modules, or a pipeline.

    Args:
        target: ``nn.Module``, mapping of name -> module, or a pipeline.
        policy: the :class:`~mixprec.policy.Policy` (see :mod:`mixprec.policy.presets`).
        keep_original: ``"cpu"`` keeps the original tensors in host memory (no copy
            for a CPU model), ``"disk"`` writes them to a safetensors file in a temp
            dir, ``"none"`` keeps nothing (``revert`` then raises).
        strict: a rule that matches no module is an error instead of a warning.

    Returns:
        An :class:`Applied`; revert it, or use it as a context manager.

    Raises:
        ApplyError: bad target/options, or the target already has a policy applied.
        PolicyError: with ``strict=True``, a rule that matches nothing.

    Example:
        >>> with mixprec.apply(model, mixprec.preset("fast")) as applied:
        ...     y = model(x)
    """
    if keep_original not in _KEEP_ORIGINAL:
        raise ApplyError(f"keep_original={keep_original!r}; choose one of: {', '.join(_KEEP_ORIGINAL)}")
    if not isinstance(policy, Policy):
        raise ApplyError(f"policy must be a mixprec Policy, got {type(policy).__name__}")
    comps, _ = components_of(target)
    for name, root in comps.items():
        for module in root.modules():
            if module.__dict__.get(_MARK):
                # Every module of an applied tree is marked: a policy on a part of an
                # applied model (or on a model containing an applied part) is refused;
                # two policies casting the same tensors could not both revert exactly.
                raise ApplyError(
                    f"component {name or '(root)'!r} already has a mixprec policy applied to it or to a part of it "
                    f"({type(module).__name__}); revert that one before applying another"
                )
    plans = _validate(comps, policy, strict)
    if policy.compile is not None:
        check_compiler(policy.compile, _on_cpu(comps))

    applied = Applied(policy, comps, plans, keep_original)
    _materialize(applied)
    return applied


def _validate(comps: dict[str, nn.Module], policy: Policy, strict: bool) -> list[ModulePlan]:
    plans, unmatched = resolve_modules(comps, policy)
    if unmatched:
        names = [p.qualname for p in plans] + sorted({p.type_name for p in plans})
        for index in unmatched:
            rule = policy.rules[index]
            message = f"policy rule #{index} {rule.match!r} matches no module; closest: {', '.join(closest_names(rule.match, names)) or 'none'}"
            if strict:
                raise PolicyError(message)
            warnings.warn(message, stacklevel=3)
    return plans


def _materialize(applied: Applied) -> None:
    """Cast, keep originals, write numerics and install hooks for ``applied.plans``."""
    plans, comps, keep_original, policy = applied.plans, applied.components, applied.keep_original, applied.policy
    by_module = {id(p.module): p for p in plans}

    # Phase 1: compute every new tensor (nothing is changed if this fails). A tensor
    # shared by modules planned in different dtypes (tied embeddings and heads, one
    # submodule in two components) is stored in the widest of them, and every plan that
    # owns it says so: a keep-fp32 pin is never silently dropped.
    owners: dict[int, tuple[torch.Tensor, list[tuple[ModulePlan, str]]]] = {}
    for plan in plans:
        for key, t in own_tensors(plan.module):
            if t.is_floating_point():
                owners.setdefault(id(t), (t, []))[1].append((plan, key))
    applied._entry_dtypes = {cname: next((t.dtype for t in root.parameters() if t.is_floating_point()), torch.float32)
                             for cname, root in comps.items()}
    new_data: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for tid, (t, owned) in owners.items():
        storages = {plan.storage for plan, _ in owned}
        widest = max(storages, key=_WIDTH.__getitem__)
        if len(storages) > 1:
            narrower = [plan for plan, _ in owned if plan.storage != widest]
            warnings.warn(f"a {tuple(t.shape)} tensor is shared by {', '.join(sorted({p.qualname or '(root)' for p, _ in owned}))} "
                          f"planned as {', '.join(sorted(storages))}: stored in {widest} for all of them", stacklevel=4)
            for plan in narrower:
                plan.storage = widest
        dtype = DTYPES[widest]
        if t.dtype != dtype:
            new_data[tid] = (t, t.data.to(dtype))
            for plan, key in owned:
                applied._locations.setdefault(tid, []).append((plan.module, key))

    # Phase 2: keep originals, then swap data in (Parameter objects keep their identity,
    # so tied weights stay tied and optimizers keep their references).
    if keep_original != "none":
        for key, (t, _) in new_data.items():
            applied.original_bytes += t.numel() * t.element_size()
            if keep_original == "cpu":
                applied._originals[key] = (t, (t.data if t.device.type == "cpu" else t.data.to("cpu"), t.device))
            else:
                applied._originals[key] = (t, t.device)
        if keep_original == "disk" and new_data:
            from safetensors.torch import save_file

            applied._disk = tempfile.TemporaryDirectory(prefix="mixprec-originals-")
            save_file({str(k): t.data.detach().to("cpu").contiguous() for k, (t, _) in new_data.items()},
                      str(Path(applied._disk.name) / "originals.safetensors"))
    for t, data in new_data.values():
        t.data = data
    applied._active = True

    try:
        if policy.numerics is not None:
            applied._numerics = backends.apply_settings(policy.numerics)
        _install_hooks(applied, comps, by_module)
        if policy.compile is not None:
            for root in comps.values():
                applied._handles.append(_Compiled(root, policy.compile))
    except BaseException:
        applied.revert()
        raise
    for root in comps.values():
        for module in root.modules():
            module.__dict__[_MARK] = True


class _Compiled:
    """A component compiled by the policy (``nn.Module.compile``); :meth:`remove` undoes it.

    The compiled region is the component's call: its forward, mixprec's casts and
    scopes, and its children (traced without graph breaks, see ``tests/test_compile.py``).
    Removing it drops the compiled code, so nothing compiled keeps the policy's dtypes.
    """

    def __init__(self, root: nn.Module, settings: Any) -> None:
        self.root = root
        root.compile(mode=settings.mode, dynamic=settings.dynamic, backend=settings.backend)

    def remove(self) -> None:
        self.root._compiled_call_impl = None


def check_compiler(settings: Any, on_cpu: bool) -> None:
    """Refuse a compile setting this machine cannot honour, before anything is cast.

    The inductor backend generates C++ for CPU tensors and needs a compiler (``$CXX``,
    else ``g++``, ``c++`` or ``clang++`` on ``PATH``).

    Raises:
        ApplyError: naming what is missing and what would work instead.
    """
    import shutil

    if settings.backend != "inductor":
        return
    candidates = [c for c in (os.environ.get("CXX"), "g++", "c++", "clang++") if c]
    if on_cpu and not any(shutil.which(c) for c in candidates):
        raise ApplyError("policy compile: the inductor backend needs a C++ compiler for CPU tensors and none was found "
                         f"(looked for {', '.join(candidates)}); install g++, set CXX, or use compile backend "
                         "'aot_eager' or 'eager' (traced, no generated code)")


def _on_cpu(comps: dict[str, nn.Module]) -> bool:
    return any(p.device.type == "cpu" for root in comps.values() for p in root.parameters())


def _dtype_fn(plan: ModulePlan, by_module: dict[int, ModulePlan]) -> Callable[[], torch.dtype]:
    """The dtype a module computes in, read at call time so it follows a later ``.half()``.

    The representative is the first floating parameter in the module's subtree that
    was planned in the same dtype (not one inside a keep-fp32 island).
    """
    if plan.compute_dtype == "fp32":
        return lambda: torch.float32
    planned = DTYPES[plan.storage]
    same = [sub for sub in plan.module.modules()
            if (sub_plan := by_module.get(id(sub))) is not None and sub_plan.compute_dtype == plan.compute_dtype]
    # Parameters keep their identity through module.half() / .to(); buffers are replaced.
    for sub in same:
        rep = next((p for p in sub._parameters.values() if p is not None and p.is_floating_point()), None)
        if rep is not None:
            return lambda: rep.dtype
    return lambda: planned


def _owns_float_weights(module: nn.Module) -> bool:
    """Own floating parameters, or (for a leaf) own floating buffers such as running stats."""
    if any(p is not None and p.is_floating_point() for p in module._parameters.values()):
        return True
    return not module._modules and any(b is not None and b.is_floating_point() for b in module._buffers.values())


def _install_hooks(applied: Applied, comps: dict[str, nn.Module], by_module: dict[int, ModulePlan]) -> None:
    handles = applied._handles
    for cname, root in comps.items():
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
                applied._pinned.append(module)
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
                    fallback=applied._entry_dtypes[cname] if is_root else None,
                )
                if is_root:
                    handles.append(add_method_hook(module, "forward", boundary.around))
                else:
                    handles.append(module.register_forward_pre_hook(boundary.pre, with_kwargs=True))
                    handles.append(module.register_forward_hook(boundary.post, with_kwargs=True, always_call=True))

            fp32_compute = plan.compute == "fp32" and not plan.keep_fp32 and plan.storage != "fp32"
            if fp32_compute:
                handles.append(Fp32Compute().install(module))
            elif mixed and not bounded and _owns_float_weights(module):
                handles.append(LeafCast(_dtype_fn(plan, by_module), 0 if layer else 2).install(module))

            if plan.upcast_attention and id(parent) not in upcast_scoped:
                direct = plan.decided_by.get("upcast_attention") is not None and policy_matches_directly(applied.policy, plan)
                if is_attention_module(module) or (direct and not any(is_attention_module(m) for m in module.modules())):
                    if sdpa_table is None:
                        sdpa_table = sdpa_upcast_table({p.device.type for p in root.parameters()} or {"cpu"})
                    scope = UpcastScope(sdpa_table)
                    handles.append(module.register_forward_pre_hook(scope.pre))
                    handles.append(module.register_forward_hook(scope.post, always_call=True))
                    upcast_scoped.add(id(module))
            if id(parent) in upcast_scoped:
                upcast_scoped.add(id(module))  # already inside a scope: no nested one

        if mixed:
            _install_spectral_scopes(applied, root)
            # Components used through their own methods (S3Gen.inference, vae.decode) hand
            # the caller its own dtype back, as a call of forward does.
            back = functools.partial(_return_caller_dtype, applied._entry_dtypes[cname])
            for method in entry_methods(root)[1:]:
                handles.append(add_method_hook(root, method, back))

        gate = EntryGate()
        handles.extend(gate.install(root))
        for child in called_children(root):
            entry = EntryBoundary(child, _dtype_fn(by_module[id(child)], by_module), gate)
            handles.append(child.register_forward_pre_hook(entry.pre, with_kwargs=True))
            handles.append(child.register_forward_hook(entry.post, with_kwargs=True, always_call=True))


def _return_caller_dtype(fallback: torch.dtype, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    caller = first_float_dtype((args, kwargs)) or fallback
    return cast_floats(call(*args, **kwargs), caller)


def _install_spectral_scopes(applied: Applied, root: nn.Module) -> None:
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
        applied._handles.append(module.register_forward_pre_hook(scope.pre))
        applied._handles.append(module.register_forward_hook(scope.post, always_call=True))
        for name in entry_methods(module)[1:]:
            applied._handles.append(add_method_hook(module, name, scope.around))
        if module is not root:
            scoped.update(id(m) for m in module.children())


def policy_matches_directly(policy: Policy, plan: ModulePlan) -> bool:
    index = plan.decided_by["upcast_attention"]
    return policy.rules[index].matches(plan.qualname, plan.module)
