"""The kinds of tensor a model can hold, and what mixprec does with each.

Every place that walks a model's tensors (apply and revert, weight bytes, the guard's
fingerprint, the profile's copies, caches) goes through these helpers, so each kind is
handled by one decision:

| kind | apply | revert | bytes counted | sampled for fingerprints |
|---|---|---|---|---|
| floating, dense | cast to the module's storage dtype | put back bit-exactly | elements x size | evenly spaced values |
| floating, sparse (COO, CSR, CSC, BSR, BSC) | values cast, layout and indices kept | the original object (layout, indices, values) | indices + values | indices and values |
| floating subclass (``__torch_function__``, nested, ``nn.Parameter`` subclasses) | cast; the object and its type are kept | put back in the same object | as dense | its values as a plain tensor |
| wrapper subclass (``__torch_dispatch__``) | as floating (its own ``.to``) | put back | its inner tensors | its inner tensors |
| complex | left: torch has almost no ``complex32`` kernels | nothing to put back | elements x size | real and imaginary parts |
| integer, bool | never cast (indices, masks, counters) | nothing to put back | elements x size | values |
| quantized | left: already stored in 8 bits with its own scales | nothing to put back | elements x size | dequantized values |
| meta | a floating one the policy would cast is refused (no values); others left | nothing to put back | 0 (no storage) | shape and dtype only |
| lazy (``UninitializedParameter``) | refused: run one forward first | — | — | — |
"""

from __future__ import annotations

import copy
from typing import Any, Iterator

import torch
from torch import nn

__all__ = ["KINDS", "kind", "castable", "stored_bytes", "stored_elements", "sample", "digest", "is_lazy", "copy_module",
           "copy_tensor", "deepcopy_refused", "fits_file"]

#: Every kind :func:`kind` names.
KINDS = ("floating", "sparse", "complex", "integer", "quantized", "meta")

_COMPRESSED = {torch.sparse_csr: ("crow_indices", "col_indices"), torch.sparse_bsr: ("crow_indices", "col_indices"),
               torch.sparse_csc: ("ccol_indices", "row_indices"), torch.sparse_bsc: ("ccol_indices", "row_indices")}


def is_lazy(t: Any) -> bool:
    """Whether ``t`` is a lazy module's parameter or buffer not yet given a shape."""
    return isinstance(t, nn.parameter.UninitializedTensorMixin)


def _wrapper(t: torch.Tensor) -> bool:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    return is_traceable_wrapper_subclass(t)


def kind(t: torch.Tensor) -> str:
    """One of :data:`KINDS` (a subclass is the kind of the values it holds)."""
    if t.is_meta:
        return "meta"
    if t.is_quantized:
        return "quantized"
    if t.is_complex():
        return "complex"
    if not t.is_floating_point():
        return "integer"
    return "floating" if t.layout == torch.strided else "sparse"


def castable(t: torch.Tensor) -> bool:
    """Whether a policy casts ``t`` to a 16-bit storage dtype (meta tensors are refused before)."""
    return t.is_floating_point() and not t.is_quantized


def _parts(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """The plain strided tensors that hold ``t``'s data (none for a meta tensor)."""
    if t.is_meta:
        return
    if _wrapper(t):
        names, _ = t.__tensor_flatten__()
        for name in names:
            yield from _parts(getattr(t, name))
        return
    if type(t) not in (torch.Tensor, nn.Parameter):
        t = t.as_subclass(torch.Tensor)  # a __torch_function__ subclass: its own storage, read as plain
    t = t.detach()
    if t.layout == torch.sparse_coo:
        yield t._indices()
        yield t._values()
    elif t.layout in _COMPRESSED:
        for name in _COMPRESSED[t.layout]:
            yield getattr(t, name)()
        yield t.values()
    elif t.is_quantized:
        yield t.int_repr()
    else:
        yield t


def stored_bytes(t: torch.Tensor) -> int:
    """Bytes ``t`` holds: a sparse tensor's indices and values, nothing for a meta tensor."""
    return sum(p.numel() * p.element_size() for p in _parts(t))


def stored_elements(t: torch.Tensor) -> int:
    """Values ``t`` stores (a sparse tensor's non-zeros; a meta tensor's shape): for shares of the weights."""
    if t.is_meta or t.layout == torch.strided or _wrapper(t):
        return t.numel()
    return (t._values() if t.layout == torch.sparse_coo else t.values()).numel()


def sample(t: torch.Tensor, n: int = 64) -> torch.Tensor:
    """Up to ``n`` evenly spaced values of each part of ``t``, as float64 on the CPU.

    Bit-exact for 16- and 32-bit floats; a complex tensor gives its real and imaginary
    parts, a quantized one its dequantized values; a meta tensor gives none.
    """
    if t.is_meta:
        return torch.zeros(0, dtype=torch.float64)
    if t.is_quantized and not _wrapper(t):
        parts: list[torch.Tensor] = [t.detach().dequantize()]
    else:
        parts = list(_parts(t))
    out = []
    for part in parts:
        if part.is_complex():
            part = torch.view_as_real(part)
        flat = part.reshape(-1)
        if flat.numel():
            step = max(1, flat.numel() // n)
            out.append(flat[::step][:n].to("cpu", torch.float64))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def digest(t: torch.Tensor, n: int = 4096) -> bytes:
    """A cheap fingerprint of ``t``'s values: its dtype, device, shape and :func:`sample` of ``n``."""
    return repr((t.dtype, t.device, tuple(t.shape))).encode() + sample(t, n).numpy().tobytes()


def fits_file(t: torch.Tensor) -> bool:
    """Whether ``t``'s values can go to a safetensors file as they are (dense, plain storage)."""
    return t.layout == torch.strided and not t.is_meta and not t.is_quantized and not _wrapper(t)


def deepcopy_refused(t: torch.Tensor) -> bool:
    """Whether torch's own ``copy.deepcopy`` refuses ``t``: a sparse parameter (it clones with
    ``preserve_format``), a compressed sparse tensor (it reads the storage) or a ``__torch_function__``
    subclass that is not an ``nn.Parameter`` subclass (its ``new_empty`` is not of its type)."""
    if t.layout != torch.strided:
        return isinstance(t, nn.Parameter) or t.layout != torch.sparse_coo
    return type(t) is not torch.Tensor and not issubclass(type(t), nn.Parameter) and not _wrapper(t)


def copy_tensor(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` of the same kind: layout, dtype, type, and parameter-ness with its ``requires_grad``."""
    data = t.detach().clone()  # every sparse layout; a __torch_function__ subclass keeps its type
    if issubclass(type(t), nn.Parameter):
        return type(t)(data, requires_grad=t.requires_grad)
    if getattr(t, "_is_param", False):  # nn.Parameter(subclass tensor) is that subclass, marked
        return nn.Parameter(data, requires_grad=t.requires_grad)
    return data.requires_grad_(t.requires_grad) if t.requires_grad else data


def copy_module(module: nn.Module, memo: dict[int, Any] | None = None) -> nn.Module:
    """``copy.deepcopy(module)`` that also copies the tensors torch's own deepcopy refuses
    (:func:`deepcopy_refused`); their copies are made by :func:`copy_tensor` and put in the memo."""
    memo = dict(memo or {})
    for t in [*module.parameters(), *module.buffers()]:
        if id(t) not in memo and deepcopy_refused(t):
            memo[id(t)] = copy_tensor(t)
    return copy.deepcopy(module, memo)
