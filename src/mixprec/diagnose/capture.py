"""What the profile reads from and copies of a module call: the first floating tensor of
an argument or output, a bounded sample of it, checksums of integer inputs, snapshots of
inputs, and deep copies of inputs that keep the model's modules and weights shared.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import torch
from torch import nn

from mixprec.diagnose.low_copy import module_tensors

__all__ = ["sample", "first_float", "int_fingerprint", "snapshot", "absmax", "fresh_inputs", "cast_owned", "shared_model_memo"]

_SAMPLE = 65536


def sample(t: torch.Tensor) -> torch.Tensor:
    """A fixed strided sample of at most 65,536 of ``t``'s values, as fp32 on the CPU."""
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


def first_float(obj: Any, depth: int = 0) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj if obj.is_floating_point() else None
    if depth > 8:
        return None
    for v in _children(obj):
        found = first_float(v, depth + 1)
        if found is not None:
            return found
    return None


def int_fingerprint(obj: Any) -> tuple[tuple[tuple[int, ...], int], ...]:
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


def snapshot(obj: Any, depth: int = 0) -> Any:
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
        items = [snapshot(o, depth + 1) for o in obj]
        if isinstance(obj, list):
            return items
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, dict):
        copied = copy.copy(obj)
        for key in list(obj.keys()):
            copied[key] = snapshot(obj[key], depth + 1)
        return copied
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        copied = copy.copy(obj)
        for f in dataclasses.fields(obj):
            if hasattr(obj, f.name):
                object.__setattr__(copied, f.name, snapshot(getattr(obj, f.name), depth + 1))
        return copied
    return obj


def absmax(t: torch.Tensor | None) -> float:
    """The largest absolute value of ``t`` (0 for none or empty, NaN if any value is NaN)."""
    if t is None or t.numel() == 0:
        return 0.0
    return float(t.detach().abs().amax().float())  # NaN if any value is NaN


def fresh_inputs(inputs: Any, comps: dict[str, nn.Module]) -> Any:
    """A deep copy of ``inputs`` for one run; the components (and their tensors) stay shared."""
    try:
        return copy.deepcopy(inputs, shared_model_memo(comps))
    except Exception:  # not copyable: both runs share it
        return inputs


def cast_owned(obj: Any, dtype: torch.dtype, min_ndim: int, depth: int = 0, seen: set[int] | None = None) -> Any:
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
        obj[:] = [cast_owned(v, dtype, min_ndim, depth + 1, seen) for v in obj]
    elif isinstance(obj, tuple):
        for v in obj:  # a tuple cannot change: cast inside what it holds (its tensors stay)
            cast_owned(v, dtype, min_ndim, depth + 1, seen)
    elif isinstance(obj, dict):
        for k in list(obj):
            obj[k] = cast_owned(obj[k], dtype, min_ndim, depth + 1, seen)
    elif hasattr(obj, "__dict__"):
        for k, v in list(vars(obj).items()):
            new = cast_owned(v, dtype, min_ndim, depth + 1, seen)
            if new is not v:
                try:
                    setattr(obj, k, new)
                except (AttributeError, TypeError):  # a read-only attribute keeps its value
                    pass
    return obj


def shared_model_memo(comps: dict[str, nn.Module]) -> dict[int, Any]:
    """A ``copy.deepcopy`` memo that keeps the components' modules and tensors shared."""
    memo: dict[int, Any] = {}
    for root in comps.values():
        for module in root.modules():
            memo[id(module)] = module
            for t in module_tensors(module):
                memo[id(t)] = t
    return memo
