"""Apply a :class:`~mixprec.policy.Policy` to modules, and take it back bit-exactly.

``apply`` pre-casts weights once (autocast re-casts them on every call and loses at
small batches), inserts casts only at precision boundaries, pins keep-fp32 modules
so that a later ``model.half()`` leaves them alone, and scopes upcast attention to
attention modules. :meth:`Applied.revert` restores every parameter and buffer
(dtype, values, device, ``requires_grad``), removes every hook and patch, and puts
back any global numeric flag the policy changed.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mixprec._signals import held_interrupt
from mixprec.device import backends
from mixprec.casting.caches import PlainTensors
from mixprec.casting.compile import Compiled, any_on_cpu, check_compiler
from mixprec.casting.explain import dtype_read_warnings, explain_rows
from mixprec.casting.follow import WeightChanges, replaced_by_app
from mixprec.casting.fp8 import FP8_DTYPES
from mixprec.casting.fp8plan import Fp8Plan
from mixprec.casting.hooks import own_tensors
from mixprec.casting.install import install_pins, install_wrappers
from mixprec.casting.kinds import castable, fits_file, set_data, stored_bytes
from mixprec.casting.offload import BeneathHooks, Offload, offload_slots
from mixprec.casting.targets import (DTYPES, ApplyError, components_of, refuse_context, refuse_meta, refuse_unsupported,
                                     weight_bytes)
from mixprec.policy import ModulePlan, Policy, PolicyError, resolve_modules
from mixprec.policy.select import UnmatchedRule, UnmatchedRuleWarning, summarise_unmatched, unmatched_rules

__all__ = ["apply", "Applied", "RevertError", "applied_part"]

_KEEP_ORIGINAL = ("cpu", "disk", "none")
_WIDTH = {"fp8-e5m2": -2, "fp8": -1, "fp16": 0, "bf16": 1, "fp32": 2}
_MARK = "_mixprec_applied"


class RevertError(RuntimeError):
    """``revert`` cannot restore the original weights (``keep_original="none"``)."""


class Applied:
    """A policy applied to a target. Use :meth:`revert`, or ``with mixprec.apply(...)``.

    Attributes:
        policy: the applied policy.
        components: the named components.
        plans: the per-module resolution (see :func:`~mixprec.casting.explain.explain`).
        keep_original: where the original tensors are kept.
        weight_bytes_before: bytes of the components' own weights (parameters and buffers) as
            they were before the policy cast them; :meth:`weight_bytes` is the same count now
            (the two are equal where the policy cast nothing).
        original_bytes: bytes the kept originals cost besides the model (RAM for ``cpu``, disk for
            ``disk``): 0 where nothing was cast, or where the originals were not kept.
        unmatched: the policy's rules that matched no module (warned once, summarised when many).
    """

    def __init__(self, policy: Policy, components: dict[str, nn.Module], plans: list[ModulePlan], keep_original: str):
        self.policy = policy
        self.components = components
        self.plans = plans
        self.keep_original = keep_original
        self.weight_bytes_before = weight_bytes(components)
        self.original_bytes = 0
        self.unmatched: list[UnmatchedRule] = []
        self._handles: list[Any] = []
        self._pinned: list[nn.Module] = []
        self._originals: dict[int, tuple[torch.Tensor, Any]] = {}
        # Where each cast tensor lives (module, "p:name" / "b:name"): an app's .half()
        # replaces buffer objects, so revert writes back through the owning module.
        self._locations: dict[int, list[tuple[nn.Module, str]]] = {}
        self._disk: tempfile.TemporaryDirectory | None = None
        self._numerics: backends.Snapshot | None = None
        self._entry_dtypes: dict[str, torch.dtype] = {}
        self._plain: PlainTensors | None = None
        # Weights the app changed after apply (load_state_dict, in place): the new originals.
        self._followed: dict[int, torch.Tensor] = {}
        self._original_dtypes: dict[int, torch.dtype] = {}
        # Each cast parameter's .grad as apply found it, set aside while the policy is applied.
        self._grads: dict[int, torch.Tensor | None] = {}
        self._changes: WeightChanges | None = None
        #: The fp8 side of this apply (scales, weights kept out of fp8), where a plan stores fp8.
        self._fp8: Fp8Plan | None = None
        #: The weights an offload hook keeps outside their modules (accelerate), cast where it keeps them.
        self._offload: Offload | None = None
        #: Counts the weight changes followed since apply (a fingerprint of the weights is stale after one).
        self.weights_version = 0
        self._reapplying = False
        self._active = True
        self._reapplied = False
        #: The :class:`~mixprec.calibration.Calibration` that chose the policy, where one did.
        self.calibration: Any = None

    @property
    def active(self) -> bool:
        return self._active

    def weight_bytes(self) -> int:
        """Bytes of the components' own weights now, as stored under the policy (compare
        :attr:`weight_bytes_before`); the kept originals are not counted (:attr:`original_bytes`)."""
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
        refuse_context("Applied.revert")
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
            missing = [key for key, (_, saved) in self._originals.items() if not isinstance(saved, tuple) and str(key) not in loaded]
            if missing:
                raise RevertError(f"{path} lacks {len(missing)} of the {len(self._originals)} original tensors; the policy "
                                  "is still applied and nothing was changed: reload the model from its checkpoint")
        # Undone whole: a Ctrl-C meanwhile is raised once every weight, hook and setting is back.
        with held_interrupt():
            if self._changes is not None:
                self._changes.sync(self._original_dtypes)  # parameters changed in place: their values, not stale ones
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
                self._numerics = None
            if self._plain is not None:
                self._plain.restore()
                self._plain = None
            self._active = False
            if self.keep_original == "none":
                raise RevertError(
                    "hooks and patches removed, but the original weights were not kept (keep_original='none'); "
                    "reload the model, or apply with keep_original='cpu' or 'disk'"
                )
            if self._offload is not None:
                self._offload.revert()
                self._offload = None
            replaced = []
            dropped = []
            for key, (tensor, saved) in self._originals.items():
                # (values, device) kept in memory, or the device of values kept on disk
                original, device = saved if isinstance(saved, tuple) else (loaded[str(key)], saved)
                original = self._followed.get(key, original).to(device)
                set_data(tensor, original)  # an inference tensor stays one, and no other becomes one
                if key in self._grads:
                    if tensor.grad is not None:
                        dropped.append(self._locations.get(key, [(None, "?")])[0])
                    tensor.grad = self._grads[key]  # as it was before apply (None for most models)
                for module, slot in self._locations.get(key, ()):
                    table = module._parameters if slot.startswith("p:") else module._buffers
                    current = table.get(slot[2:])
                    if current is not None and current is not tensor:
                        if slot.startswith("p:"):
                            if replaced_by_app(current, tensor):
                                replaced.append(f"{type(module).__name__}.{slot[2:]}")  # the app's own object now
                            else:
                                set_data(current, original)
                        else:
                            table[slot[2:]] = tensor
            if self._fp8 is not None:
                self._fp8.release()
            flatten_rnns(self.components)
            self._originals.clear()
            self._locations.clear()
            self._followed.clear()
            self._grads.clear()
            self._changes = None
            if dropped:
                qualnames = {id(p.module): p.qualname for p in self.plans}
                names = [f"{qualnames.get(id(module), type(module).__name__)}.{slot[2:]}".lstrip(".") for module, slot in dropped]
                warnings.warn(f"revert dropped the gradients computed under the policy for {len(names)} parameter(s) "
                              f"({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}): they are gradients of the 16-bit "
                              "weights; each .grad is back as it was before apply", stacklevel=2)
            if replaced and not self._reapplying:  # a re-apply casts the app's new object afresh
                warnings.warn(f"{len(replaced)} parameter(s) were replaced after the policy was applied ({', '.join(replaced[:4])}"
                              f"{', ...' if len(replaced) > 4 else ''}): left as the app set them", stacklevel=2)
            if self._disk is not None:
                self._disk.cleanup()
                self._disk = None

    def original_tensors(self) -> dict[int, torch.Tensor]:
        """The kept originals, by ``id`` of the live tensor (empty with ``keep_original="none"``)."""
        if self._disk is not None:
            from safetensors.torch import load_file

            loaded = load_file(str(Path(self._disk.name) / "originals.safetensors"))
            return {key: self._followed.get(key, saved[0] if isinstance(saved, tuple) else loaded[str(key)])
                    for key, (_, saved) in self._originals.items()}
        return {key: self._followed.get(key, saved[0]) for key, (_, saved) in self._originals.items()}

    def _follow(self, key: int, value: torch.Tensor) -> None:
        """Make ``value`` (the app's new weight, at any precision) the original of tensor ``key``."""
        self._followed[key] = value.to("cpu", self._original_dtypes[key], copy=True)
        if self._fp8 is not None and key in self._originals:
            self._fp8.requantise(self._originals[key][0], value)  # fp8 values of the new weight, with its scale
        self.weights_version += 1

    def reapply(self, policy: Policy, *, strict: bool = False) -> None:
        """Swap in another policy on the same components, from the original weights.

        The new policy is validated first; the old one is reverted only then. Used by
        the numerics guard to pin an overflowing module to a wider dtype.

        Raises:
            ApplyError: when the originals were not kept (``keep_original="none"``).
        """
        refuse_context("Applied.reapply")
        if self.keep_original == "none":
            raise ApplyError("cannot re-apply a policy applied with keep_original='none': the original weights are gone")
        if not isinstance(policy, Policy):
            raise ApplyError(f"policy must be a mixprec Policy, got {type(policy).__name__}")
        plans, unmatched = _validate(self.components, policy, strict)
        if policy.compile is not None:
            check_compiler(policy.compile, any_on_cpu(self.components))
        if self._active:
            # The same numerics stay in force (and the app's own later change to them with them).
            kept = self._numerics if policy.numerics == self.policy.numerics else None
            if kept is not None:
                self._numerics = None
            self._reapplying = True
            try:
                self.revert()
            finally:
                self._reapplying = False
                self._numerics = kept
        self.policy, self.plans, self.original_bytes, self.unmatched = policy, plans, 0, unmatched
        # A re-apply (the guard's fallback, possibly in the middle of a call) keeps the full set of
        # wrappers even where the new policy is all fp32: the call in flight may hold 16-bit tensors.
        self._reapplied = True
        _materialize(self)

    # The table `mixprec explain` prints.
    def explain(self) -> list[dict[str, Any]]:
        return explain_rows(self.plans, self.policy, self._fp8)

    def warnings(self) -> list[str]:
        """Precision pitfalls of this policy on these modules (see :func:`dtype_read_warnings`)."""
        return dtype_read_warnings(self.plans)



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

    Examples:
        >>> with mixprec.apply(model, mixprec.preset("fast")) as applied:
        ...     y = model(x)
    """
    if keep_original not in _KEEP_ORIGINAL:
        raise ApplyError(f"keep_original={keep_original!r}; choose one of: {', '.join(_KEEP_ORIGINAL)}")
    if not isinstance(policy, Policy):
        raise ApplyError(f"policy must be a mixprec Policy, got {type(policy).__name__}")
    comps, _ = components_of(target)
    refuse_unsupported(comps)
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
    plans, unmatched = _validate(comps, policy, strict)
    unwritable: list[tuple[nn.Module, str, str]] = []
    offloaded = offload_slots((p.module for p in plans), unwritable)  # meta placeholders an offload hook fills
    cast = {id(p.module): (DTYPES[p.storage], p.qualname) for p in plans}
    unwritable = [(f"{cast[id(m)][1]}.{key[2:]}".lstrip("."), kind) for m, key, kind in unwritable
                  if (t := getattr(m, key[2:])).is_floating_point() and t.dtype != cast[id(m)][0]]
    if unwritable:
        raise ApplyError(f"{len(unwritable)} weight(s) the policy would cast are offloaded by accelerate into a weights "
                         f"map of type {unwritable[0][1]} (first: {unwritable[0][0]!r}), which mixprec cannot write into; "
                         "nothing was changed. Offload into a dict or accelerate's OffloadedWeightsLoader (what "
                         "cpu_offload, dispatch_model and a device_map use)")
    refuse_meta([(f"{p.qualname}.{key[2:]}".lstrip("."), t) for p in plans for key, t in own_tensors(p.module)
                 if t.is_floating_point() and t.dtype != DTYPES[p.storage] and (id(p.module), key) not in offloaded])
    if policy.compile is not None:
        check_compiler(policy.compile, any_on_cpu(comps))

    applied = Applied(policy, comps, plans, keep_original)
    applied.unmatched = unmatched
    _materialize(applied)
    return applied


def _wrapped(policy: Policy, plans: list[ModulePlan], comps: dict[str, nn.Module], cast: bool, reapplied: bool) -> bool:
    """Whether an apply installs wrappers: not where nothing changes a dtype (a first apply of
    an all-fp32 plan on fp32 weights), nor for ``wrappers="none"`` on a uniform plan (one
    storage and compute dtype everywhere, nothing upcast); a re-apply (the guard's fallback,
    maybe mid-call) always does."""
    if reapplied:
        return True
    uniform = len({(p.storage, p.compute_dtype) for p in plans}) <= 1 and not any(p.upcast_attention or p.output_dtype for p in plans)
    if policy.wrappers == "none" and uniform:
        return False
    return cast or not uniform or any(p.storage != "fp32" or p.compute_dtype != "fp32" for p in plans) or not _all_fp32(comps)


def _all_fp32(comps: dict[str, nn.Module]) -> bool:
    """Every floating-point parameter and buffer of the components is fp32 (whatever its kind: sparse, subclass)."""
    return all(t.dtype == torch.float32 for root in comps.values() for t in [*root.parameters(), *root.buffers()]
               if t is not None and t.is_floating_point())


def applied_part(comps: dict[str, nn.Module]) -> str | None:
    """The name of the first component that has a mixprec policy applied to it or to a part of it, else ``None``."""
    for name, root in comps.items():
        if any(module.__dict__.get(_MARK) for module in root.modules()):
            return name or "(root)"
    return None


def flatten_rnns(comps: dict[str, nn.Module]) -> None:
    """Put every RNN's weights back into one contiguous buffer after they were swapped.

    cuDNN runs an ``LSTM``/``GRU`` from a single flat weight buffer; weights cast (or
    restored) one tensor at a time leave it, and every later call then re-packs them and
    warns ("RNN module weights are not part of single contiguous chunk of memory"). On
    the CPU, and for an RNN whose weights differ in dtype, this is a no-op (torch's own rule).
    """
    for root in comps.values():
        for module in root.modules():
            if isinstance(module, nn.RNNBase):
                module.flatten_parameters()


def _validate(comps: dict[str, nn.Module], policy: Policy, strict: bool) -> tuple[list[ModulePlan], list[UnmatchedRule]]:
    """The plans, and the rules that match nothing: one warning (an error with ``strict``)
    per rule, or one line for them all when there are many."""
    plans, indices = resolve_modules(comps, policy)
    unmatched = unmatched_rules(plans, policy, indices)
    lines = summarise_unmatched(unmatched)
    if lines and strict:
        raise PolicyError("\n".join(lines))
    for line in lines:
        warnings.warn(line, UnmatchedRuleWarning, stacklevel=3)
    return plans, unmatched


def _materialize(applied: Applied) -> None:
    """Cast, keep originals, write numerics and install hooks for ``applied.plans``."""
    plans, comps, keep_original, policy = applied.plans, applied.components, applied.keep_original, applied.policy
    by_module = {id(p.module): p for p in plans}

    # Phase 1: compute every new tensor (nothing is changed if this fails). A tensor
    # shared by modules planned in different dtypes (tied embeddings and heads, one
    # submodule in two components) is stored in the widest of them, and every plan that
    # owns it says so: a keep-fp32 pin is never silently dropped.
    owners: dict[int, tuple[torch.Tensor, list[tuple[ModulePlan, str]]]] = {}
    offload = Offload(comps)
    for plan in plans:
        for key, t in own_tensors(plan.module):
            if castable(t) and not offload.holds(plan.module, key):
                owners.setdefault(id(t), (t, []))[1].append((plan, key))
    applied._plain = PlainTensors(comps)
    applied._entry_dtypes = {cname: next((t.dtype for t in root.parameters() if t.is_floating_point()), torch.float32)
                             for cname, root in comps.items()}
    new_data: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    fp8 = Fp8Plan(comps, plans, policy)
    for tid, (t, owned) in owners.items():
        storages = {fp8.tensor_storage(plan, key, t) for plan, key in owned}
        widest = max(storages, key=_WIDTH.__getitem__)
        if len(storages) > 1:
            narrower = [plan for plan, key in owned if fp8.tensor_storage(plan, key, t) != widest]
            warnings.warn(f"a {tuple(t.shape)} tensor is shared by {', '.join(sorted({p.qualname or '(root)' for p, _ in owned}))} "
                          f"planned as {', '.join(sorted(storages))}: stored in {widest} for all of them", stacklevel=4)
            for plan in narrower:
                if plan.storage not in FP8_DTYPES:  # an fp8 plan keeps its other weights in fp8
                    plan.storage = widest
        if widest in FP8_DTYPES:
            new_data[tid] = (t, fp8.cast(t, widest, owned))
        elif t.dtype != DTYPES[widest]:
            new_data[tid] = (t, t.data.to(DTYPES[widest]))
        else:
            continue
        for plan, key in owned:
            applied._locations.setdefault(tid, []).append((plan.module, key))

    offload.stage(offload.storages(plans, fp8, DTYPES))

    # Phase 2: keep originals, then swap data in (Parameter objects keep their identity,
    # so tied weights stay tied and optimizers keep their references).
    if keep_original != "none":
        # Tensors a safetensors file cannot hold as they are (sparse ones) stay in memory with "disk".
        on_disk = {k: t for k, (t, _) in new_data.items() if keep_original == "disk" and fits_file(t)}
        for key, (t, _) in new_data.items():
            applied.original_bytes += stored_bytes(t)
            if key in on_disk:
                applied._originals[key] = (t, t.device)
            else:
                applied._originals[key] = (t, (t.data if t.device.type == "cpu" else t.data.to("cpu"), t.device))
        if on_disk:
            from safetensors.torch import save_file

            applied._disk = tempfile.TemporaryDirectory(prefix="mixprec-originals-")
            save_file({str(k): t.data.detach().to("cpu").contiguous() for k, t in on_disk.items()},
                      str(Path(applied._disk.name) / "originals.safetensors"))
        # A .grad of the full-precision weight does not fit its 16-bit self: set aside, put back at revert.
        applied._grads = {key: t.grad for key, (t, _) in new_data.items() if t.is_leaf}
    try:
        # A Ctrl-C from here on is raised once the model is whole: applied, then reverted below.
        with held_interrupt():
            applied._original_dtypes = {key: t.dtype for key, (t, _) in new_data.items()}
            for tid, (t, data) in new_data.items():
                set_data(t, data)
                if keep_original != "none":
                    t.grad = None
            applied._fp8 = fp8.register(new_data)
            offload.commit(keep_original)
            applied._offload, applied.original_bytes = offload, applied.original_bytes + offload.original_bytes
            flatten_rnns(comps)
            applied._active = True

            if policy.numerics is not None and applied._numerics is None:  # a re-apply may keep them in force
                applied._numerics = backends.apply_settings(policy.numerics, owner=f"the numerics of policy {policy.name!r}",
                                                            keep_app_changes=True)
            if _wrapped(policy, plans, comps, bool(new_data), applied._reapplied):
                beneath = BeneathHooks(comps)  # beneath accelerate's hooks, which move offloaded weights in
                last, first = beneath.handles()
                applied._handles.append(last)
                with beneath:
                    install_wrappers(comps, by_module, policy, applied._entry_dtypes, applied._handles, applied._pinned)
                applied._handles.append(first)
            else:  # nothing changes a dtype, or the policy asks for none: no wrapper
                install_pins(comps, by_module, applied._pinned)
            if keep_original != "none":
                applied._changes = WeightChanges({key: t for key, (t, _) in new_data.items()}, applied._locations, applied._follow)
                applied._handles.extend(applied._changes.install(comps))
            if policy.compile is not None:
                for root in comps.values():
                    applied._handles.append(Compiled(root, policy.compile))
            for root in comps.values():
                for module in root.modules():
                    module.__dict__[_MARK] = True
    except BaseException:
        if applied._active:
            applied.revert()
        raise

