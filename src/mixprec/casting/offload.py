"""Weights an offload hook keeps outside the module: accelerate's ``cpu_offload`` and the
offload of a ``device_map`` (``"cpu"`` or ``"disk"``), under transformers and diffusers.

Such a module holds a meta placeholder; its ``AlignDevicesHook`` keeps the values in a
weights map (a state dict in host memory, or an index of files on disk) and moves them
in at each call, cast to the placeholder's dtype. A policy casts them where the hook
keeps them: the map's entry is replaced by the value in the storage dtype (a 16-bit
copy in host memory, or in a file of its own for a weight kept on disk) and the
placeholder takes that dtype, so that what the hook moves in is already stored as
planned. :meth:`Offload.revert` puts back the map's original entries (the same
objects) and the placeholders' dtypes.
"""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, MutableMapping

import torch
from torch import nn

from mixprec.casting.hooks import _METHOD_TABLE
from mixprec.casting.kinds import stored_bytes

__all__ = ["BeneathHooks", "Offload", "OffloadSlot", "offload_slots", "offloaded_bytes", "describe_offloaded"]


@dataclass
class OffloadSlot:
    """One tensor an offload hook keeps outside its module.

    Attributes:
        module: the module whose placeholder (a meta tensor) stands for it.
        key: ``"p:name"`` or ``"b:name"`` in that module.
        store: the mapping that holds it (a state dict, or an ``OffloadedWeightsLoader``).
        store_key: its key in ``store``.
        on_disk: held in a file (the loader's index), not in host memory.
    """

    module: nn.Module
    key: str
    store: Any
    store_key: str
    on_disk: bool

    def value(self) -> torch.Tensor:
        return self.store[self.store_key]

    def placeholder(self) -> torch.Tensor | None:
        table = self.module._parameters if self.key.startswith("p:") else self.module._buffers
        return table.get(self.key[2:])


def _hooks(module: nn.Module) -> list[Any]:
    """The offloading ``AlignDevicesHook``s attached to ``module`` (one, or inside a ``SequentialHook``)."""
    hook = module.__dict__.get("_hf_hook")
    if hook is None:
        return []
    hooks = list(getattr(hook, "hooks", (hook,)))
    return [h for h in hooks if getattr(h, "offload", False) and getattr(h, "weights_map", None) is not None]


def _innermost(weights_map: Any) -> Any:
    while hasattr(weights_map, "dataset") and hasattr(weights_map, "prefix"):
        weights_map = weights_map.dataset
    return weights_map


def _resolve(weights_map: Any, name: str) -> tuple[Any, str, bool] | None:
    """(mapping that holds ``name``, its key there, on disk) through accelerate's prefixed views."""
    from accelerate.utils.offload import OffloadedWeightsLoader, PrefixedDataset

    while isinstance(weights_map, PrefixedDataset):
        name, weights_map = f"{weights_map.prefix}{name}", weights_map.dataset
    if isinstance(weights_map, OffloadedWeightsLoader):
        if name in weights_map.state_dict:
            return weights_map.state_dict, name, False
        if name in weights_map.index:
            return weights_map, name, True
        return None
    if isinstance(weights_map, MutableMapping) and name in weights_map:
        return weights_map, name, False
    return None


def offload_slots(modules: Iterable[nn.Module], unwritable: list[tuple[nn.Module, str, str]] | None = None,
                  ) -> dict[tuple[int, str], OffloadSlot]:
    """Every tensor of ``modules`` an offload hook keeps outside its module, keyed by
    ``(id(owning module), "p:name")``. Only meta placeholders count: a tensor the hook left
    in the module (a buffer it does not offload) is the module's own. ``unwritable``
    collects ``(module, key, type of the map)`` for placeholders whose hook keeps them
    in a map this module cannot write (not a dict, nor accelerate's loader)."""
    slots: dict[tuple[int, str], OffloadSlot] = {}
    for module in modules:
        for hook in _hooks(module):
            owners = module.named_modules() if getattr(hook, "place_submodules", False) else [("", module)]
            for prefix, owner in owners:
                tensors = [(f"p:{n}", t) for n, t in owner._parameters.items()]
                if getattr(hook, "offload_buffers", False):
                    tensors += [(f"b:{n}", t) for n, t in owner._buffers.items()]
                for key, t in tensors:
                    if t is None or not t.is_meta:
                        continue
                    found = _resolve(hook.weights_map, f"{prefix}.{key[2:]}".lstrip("."))
                    if found is not None:
                        slots[(id(owner), key)] = OffloadSlot(owner, key, *found)
                    elif unwritable is not None:
                        unwritable.append((owner, key, type(_innermost(hook.weights_map)).__name__))
    return slots


def _same(t: torch.Tensor) -> tuple:
    """What identifies the values of a map entry: views of one storage (a tied weight in a
    state dict) are one tensor."""
    if t.is_meta or t.layout != torch.strided:
        return (id(t),)
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def offloaded_bytes(modules: Iterable[nn.Module]) -> int:
    """Bytes of the tensors offload hooks keep for ``modules`` (each stored tensor once; a
    weight on disk by its file's dtype and shape)."""
    seen: set[Any] = set()
    total = 0
    for slot in offload_slots(modules).values():
        if slot.on_disk:
            info = slot.store.index[slot.store_key]
            ident = (info.get("safetensors_file"), info.get("weight_name", slot.store_key))
            if ident in seen:
                continue
            seen.add(ident)
            total += _disk_bytes(slot)
        else:
            t = slot.value()
            if _same(t) not in seen:
                seen.add(_same(t))
                total += stored_bytes(t)
    return total


#: Bytes per element of the dtypes a safetensors file names.
_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
                      "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def _disk_bytes(slot: OffloadSlot) -> int:
    """Bytes of a weight kept on disk, as its file stores it."""
    info = slot.store.index[slot.store_key]
    placeholder = slot.placeholder()
    fallback = placeholder.element_size() if placeholder is not None else 4
    if "safetensors_file" in info:
        from safetensors import safe_open

        with safe_open(info["safetensors_file"], framework="pt") as f:
            part = f.get_slice(info.get("weight_name", slot.store_key))
            shape, size = part.get_shape(), _SAFETENSORS_BYTES.get(part.get_dtype(), fallback)
    else:  # accelerate's own .dat files: the index says their dtype and shape
        shape, size = info.get("shape", ()), torch.empty((), dtype=getattr(torch, info["dtype"])).element_size()
    numel = 1
    for n in shape:
        numel *= int(n)
    return numel * size


def describe_offloaded(modules: Iterable[nn.Module]) -> dict[int, str]:
    """What ``explain`` says of each module (by ``id``) whose tensors an offload hook keeps."""
    found: dict[int, list[OffloadSlot]] = {}
    for slot in offload_slots(modules).values():
        found.setdefault(id(slot.module), []).append(slot)
    out = {}
    for mid, slots in found.items():
        disk = {s.on_disk for s in slots}
        where = "on disk" if disk == {True} else "in host memory" if disk == {False} else "in host memory and on disk"
        out[mid] = (f"offloaded ({', '.join(s.key[2:] for s in slots)}): accelerate's offload hook keeps them {where} "
                    "and moves them in at each call; stored there in the planned dtype")
    return out


class BeneathHooks:
    """Installs a policy's forward wrappers beneath accelerate's hooks, and takes them out again.

    accelerate replaces a hooked module's ``forward`` with its own, which moves the
    weights in (``pre_forward``) and then calls the forward it kept (``_old_forward``).
    A wrapper that reads the module's weights (computing in fp32 from 16-bit ones) must
    run after that, where the weights are in the module, so the wrappers go around the
    kept forward: ``with beneath: install(...)`` installs them as usual and then moves
    them below the hook. Their table of method hooks moves with them, apart from the one
    of hooks added on top later (the guard's). :meth:`handles` are removed around the
    wrappers' own handles (``first`` before them, ``last`` after): the wrappers come back
    on top to be removed, then the hook's forward, or whatever was put on top of it
    since, is put back.
    """

    def __init__(self, components: dict[str, nn.Module]):
        self.modules = [m for root in components.values() for m in root.modules()
                        if "_hf_hook" in m.__dict__ and "_old_forward" in m.__dict__ and "forward" in m.__dict__]
        self._top: dict[int, tuple[Any, Any]] = {}  # forward and method-hook table above the hook's forward
        self._inner: dict[int, Any] = {}  # the method-hook table of the wrappers beneath it

    def _lift(self) -> None:
        """Make the kept forward (with the wrappers around it) the module's forward, and their table its table."""
        for m in self.modules:
            self._top[id(m)] = (m.__dict__.get("forward"), m.__dict__.pop(_METHOD_TABLE, None))
            m.__dict__["forward"] = m.__dict__["_old_forward"]
            inner = self._inner.pop(id(m), None)
            if inner is not None:
                m.__dict__[_METHOD_TABLE] = inner

    def _lower(self) -> None:
        """Keep what is now the module's forward as the hook's kept forward, and put the top back."""
        for m in self.modules:
            if id(m) not in self._top:
                continue
            forward, table = self._top.pop(id(m))
            m.__dict__["_old_forward"] = m.__dict__.get("forward", m.__dict__["_old_forward"])
            m.__dict__["forward"] = forward
            inner = m.__dict__.pop(_METHOD_TABLE, None)
            if inner:
                self._inner[id(m)] = inner
            if table is not None:
                m.__dict__[_METHOD_TABLE] = table

    def __enter__(self) -> BeneathHooks:
        self._lift()
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:  # on an error the wrappers stay on top, where their removal finds them; ``last`` lowers
            self._lower()

    def handles(self) -> tuple[Any, Any]:
        """(``last``, ``first``): append ``last`` before the wrappers' handles, ``first`` after them."""
        return _Handle(self._lower), _Handle(self._lift)


class _Handle:
    def __init__(self, action: Any):
        self.remove = action


_ORDER = {torch.float8_e5m2: 0, torch.float8_e4m3fn: 1, torch.float16: 2, torch.bfloat16: 3, torch.float32: 4, torch.float64: 5}


class Offload:
    """The offloaded tensors of one apply: the new values (phase 1), the swap (phase 2), the revert."""

    def __init__(self, components: dict[str, nn.Module]):
        self.slots = offload_slots(m for root in components.values() for m in root.modules())
        self._planned: list[tuple[OffloadSlot, torch.dtype]] = []
        self._new: dict[tuple, torch.Tensor] = {}  # original values (see _same) -> their value in the storage dtype
        self._entries: list[tuple[OffloadSlot, Any]] = []  # (slot, original entry: a tensor, a key on disk, an index record)
        self._dtypes: list[tuple[OffloadSlot, torch.dtype]] = []
        self._files: tempfile.TemporaryDirectory | None = None
        #: Bytes of the originals kept (none for weights the hook keeps on disk: their files stay as they are).
        self.original_bytes = 0

    def holds(self, module: nn.Module, key: str) -> bool:
        return (id(module), key) in self.slots

    def storages(self, plans: list[Any], fp8: Any, dtypes: dict[str, torch.dtype]) -> dict[tuple[int, str], torch.dtype]:
        """The storage dtype planned for each offloaded tensor of ``plans`` (``dtypes``: policy dtype
        name -> torch dtype). fp8 storage keeps a
        scale beside the weight, which the hook's copy at each call cannot carry: an
        offloaded weight of an fp8 plan is stored in the plan's compute dtype (warned, and
        ``explain`` says so)."""
        from mixprec.casting.fp8 import FP8_DTYPES
        from mixprec.casting.fp8plan import fp8_layer

        out: dict[tuple[int, str], torch.dtype] = {}
        kept = []
        for plan in plans:
            for key, t in [*plan.module._parameters.items(), *plan.module._buffers.items()]:
                key = f"{'p' if key in plan.module._parameters else 'b'}:{key}"
                if t is None or not self.holds(plan.module, key) or not t.is_floating_point():
                    continue
                storage = fp8.tensor_storage(plan, key, t)
                if plan.storage in FP8_DTYPES and key == "p:weight" and fp8_layer(plan.module):
                    name = f"{plan.qualname}.weight".lstrip(".")
                    fp8.kept[name] = "offloaded by accelerate: its hook copies the weight in at each call, without an fp8 scale"
                    kept.append(name)
                out[(id(plan.module), key)] = dtypes[storage]
        if kept:
            warnings.warn(f"{len(kept)} offloaded weight(s) planned in fp8 are stored in their compute dtype instead "
                          f"({', '.join(kept[:4])}{', ...' if len(kept) > 4 else ''}): accelerate's offload hook copies each "
                          "weight in at every call, and fp8 storage needs its scale beside the weight in its module", stacklevel=5)
        return out

    def stage(self, storages: dict[tuple[int, str], torch.dtype]) -> None:
        """Phase 1: the new value of every offloaded tensor, in its storage dtype (nothing changes yet).

        ``storages``: ``(id(module), key)`` -> the storage dtype planned for it. A value two
        slots share (a tied weight) is cast once, to the widest dtype planned for it.
        """
        planned = [(self.slots[where], dtype) for where, dtype in storages.items()]
        planned = [(s, d) for s, d in planned if s.placeholder() is not None and s.placeholder().is_floating_point()]
        widest: dict[tuple, torch.dtype] = {}
        for slot, dtype in planned:
            if not slot.on_disk:
                old = widest.get(_same(slot.value()))
                widest[_same(slot.value())] = dtype if old is None or _ORDER[dtype] > _ORDER[old] else old
        for slot, dtype in planned:
            if not slot.on_disk:
                value = slot.value()
                dtype = widest[_same(value)]
                if value.dtype != dtype and _same(value) not in self._new:
                    self._new[_same(value)] = value.to(dtype)
            if slot.placeholder().dtype != dtype:
                self._planned.append((slot, dtype))

    def commit(self, keep_original: str) -> None:
        """Phase 2: swap the new values into the hooks' maps, and give each placeholder its dtype.

        The originals in host memory stay there (``keep_original="cpu"``; the same objects
        go back at revert), go to a file (``"disk"``) or are dropped (``"none"``); the
        files of weights kept on disk are never changed.
        """
        disk = [(s, d) for s, d in self._planned if s.on_disk]
        if disk or (keep_original == "disk" and self._new):
            self._files = tempfile.TemporaryDirectory(prefix="mixprec-offload-")
        if disk:
            self._write_disk(disk, keep_original)
        originals: dict[str, torch.Tensor] = {}
        originals_keys: dict[tuple, str] = {}
        for slot, dtype in self._planned:
            if not slot.on_disk:
                value = slot.value()
                if _same(value) in self._new:
                    key = originals_keys.setdefault(_same(value), str(len(originals_keys)))  # one per stored tensor
                    originals.setdefault(key, value)
                    if keep_original != "none":
                        self._entries.append((slot, key if keep_original == "disk" else value))
                    slot.store[slot.store_key] = self._new[_same(value)]
            placeholder = slot.placeholder()
            self._dtypes.append((slot, placeholder.dtype))
            placeholder.data = torch.empty(placeholder.shape, dtype=dtype, device="meta")
        if keep_original != "none":  # what the kept originals cost, in memory or in a file (as apply counts them)
            self.original_bytes = sum(stored_bytes(t) for t in originals.values())
        if keep_original == "disk" and originals:
            from safetensors.torch import save_file

            save_file({k: t.clone() for k, t in originals.items()}, str(Path(self._files.name) / "originals.safetensors"))
        self._new.clear()

    def _write_disk(self, planned: list[tuple[OffloadSlot, torch.dtype]], keep_original: str) -> None:
        """Weights kept on disk: their cast values go to a file of this apply's own, and the
        loader's index points there; the original files are left as they are."""
        from safetensors.torch import save_file

        path = str(Path(self._files.name) / "cast.safetensors")
        values = {}
        for slot, dtype in planned:
            values.setdefault(slot.store_key, slot.value().to(dtype).contiguous())
        save_file(values, path)
        for slot, _ in planned:
            if keep_original != "none":
                self._entries.append((slot, slot.store.index[slot.store_key]))
            slot.store.index[slot.store_key] = {"safetensors_file": path, "weight_name": slot.store_key}

    def revert(self) -> None:
        """Put back every map entry (the original objects) and every placeholder's dtype."""
        loaded: dict[str, torch.Tensor] = {}
        if any(isinstance(original, str) for _, original in self._entries):
            from safetensors.torch import load_file

            loaded = load_file(str(Path(self._files.name) / "originals.safetensors"))
        for slot, original in reversed(self._entries):
            if slot.on_disk:
                slot.store.index[slot.store_key] = original
            else:
                slot.store[slot.store_key] = loaded[original] if isinstance(original, str) else original
        for slot, dtype in self._dtypes:
            current = slot.placeholder()  # the hook replaces the placeholder object at each call
            if current is None:
                continue
            if not current.is_meta:
                warnings.warn(f"{type(slot.module).__name__}.{slot.key[2:]} holds values on {current.device} at revert "
                              "(a call the offload hook did not finish): put back as a meta placeholder, its values "
                              "are in the hook's map", stacklevel=3)
            current.data = torch.empty(current.shape, dtype=dtype, device="meta")
        self._entries.clear()
        self._dtypes.clear()
        if self._files is not None:
            self._files.cleanup()
            self._files = None
