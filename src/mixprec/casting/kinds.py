"""The kinds of tensor a model can hold, and what mixprec does with each.

Every place that walks a model's tensors (apply and revert, weight bytes, the guard's
fingerprint, the profile's copies, caches) goes through these helpers, so each kind is
handled by one decision:

| kind | apply | revert | bytes counted | sampled for fingerprints |
|---|---|---|---|---|
| floating, dense (any strides: transposed, expanded, views sharing storage; conj/neg bits; float64; fp8) | cast to the module's storage dtype | put back bit-exactly (the same view of the same storage) | elements x size | evenly spaced values |
| floating, sparse COO | values cast, layout and indices kept | the original object (layout, indices, values) | indices + values | indices and values |
| floating, compressed sparse (CSR, CSC, BSR, BSC) | left: torch's ``.data =`` would relabel the dtype and keep the values | nothing to put back | indices + values | indices and values |
| floating subclass (``__torch_function__``, ``nn.Parameter`` subclasses) | cast; the object and its type are kept | put back in the same object | as dense | its values as a plain tensor |
| wrapper subclass (``__torch_dispatch__``: jagged nested tensors, DTensor, forward-AD duals) | as floating (its own ``.to``) | put back | its inner tensors | its inner tensors |
| nested (strided layout) | as floating | put back | its components | its components |
| inference tensor (made under ``torch.inference_mode``: no version counter) | cast; stays an inference tensor | put back | as its kind | as its kind; writes are found by the sample |
| complex | left: torch has almost no ``complex32`` kernels | nothing to put back | elements x size | real and imaginary parts |
| integer, bool | never cast (indices, masks, counters) | nothing to put back | elements x size | values |
| quantized (per tensor, per channel; ``torch.ao`` modules' packed weights are not tensors) | left: already stored in 8 bits with its own scales | nothing to put back | elements x size | dequantized values |
| meta, fake (``FakeTensorMode``) | a floating one the policy would cast is refused (no values); others left | nothing to put back | 0 (no storage) | shape and dtype only |
| mkldnn layout | a floating one the policy would cast is refused (torch cannot change it in place); others left | nothing to put back | elements x size | its values, as dense |
| bit-packed dtypes (``float4_e2m1fn_x2``, ``int1``..``int7``, ``uint1``..``uint7``, ``bits8``..) | left: torch converts none of them | nothing to put back | elements x size | their bytes, as integers |
| functorch-wrapped (escaped from ``vmap``/``grad``) | refused, whatever the policy | — | — | — |
| lazy (``UninitializedParameter``) | refused: run one forward first | — | — | — |

Hooks on a tensor (``register_hook``, ``register_post_accumulate_grad_hook``), ``requires_grad``
non-leaf buffers and tensors on a GPU are kinds of the table above: apply keeps the object, so
they stay. Apply itself is refused inside a ``torch.func`` transform, under torch's fake,
functional and proxy dispatch modes (``make_fx``, ``torch.export``) and inside ``torch.jit.trace``
(:func:`refusal_of_context`); under ``inference_mode``, ``no_grad``, autocast, ``torch.compile``
and an app's own dispatch or function modes it works, and no tensor of the model becomes an
inference tensor (or stops being one).
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Iterator

import torch
from torch import nn

__all__ = ["KINDS", "kind", "castable", "converts", "refusal", "unusable", "refusal_of_context", "set_data", "stored_bytes",
           "stored_elements", "sample", "digest", "is_lazy", "copy_module", "copy_tensor", "deepcopy_refused", "fits_file"]

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


def _no_values(t: torch.Tensor) -> bool:
    """A meta tensor, or a fake one (``FakeTensorMode``, also inside a wrapper subclass): shape and dtype only."""
    from torch._subclasses.fake_tensor import is_fake

    return t.is_meta or is_fake(t)


def _nested(t: torch.Tensor) -> bool:
    """A nested tensor of the strided layout (the jagged one is a wrapper subclass)."""
    return t.is_nested and not _wrapper(t)


def unusable(t: torch.Tensor) -> str | None:
    """Why no mixprec step can read ``t`` at all, whatever the policy, or ``None``."""
    if torch._C._functorch.is_functorch_wrapped_tensor(t):
        return ("a torch.func (functorch) wrapped tensor, made inside vmap/grad/functionalize and kept after it ended: "
                "torch refuses to read or write its data outside the transform. Store a plain tensor instead "
                "(compute it outside the transform, or torch.func's outputs)")
    return None


@functools.lru_cache(maxsize=None)
def converts(dtype: torch.dtype, device_type: str) -> bool:
    """Whether torch converts ``dtype`` to and from float32 on ``device_type`` (not the bit-packed
    dtypes: ``float4_e2m1fn_x2``, ``int1``..``int7``, ``uint1``..``uint7``, ``bits8``..)."""
    try:
        torch.zeros(1, device=device_type).to(dtype).to(torch.float32)
    except NotImplementedError:  # torch names the missing kernel; the answer is "no"
        return False
    return True


_SAME_SIZE_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def refusal(t: torch.Tensor) -> str | None:
    """Why apply cannot cast ``t`` to another dtype in place, or ``None`` where it can."""
    if _no_values(t):
        return "on the meta device" if t.is_meta else "a fake tensor (FakeTensorMode)"
    if t.layout == torch._mkldnn:
        return "of the mkldnn layout, which torch cannot convert to another dtype in place"
    return unusable(t)


def refusal_of_context() -> str | None:
    """Why apply cannot run where it is called (inside a ``torch.func`` transform, under torch's
    fake, functional or proxy dispatch mode, inside ``torch.jit.trace``), or ``None``."""
    interpreter = torch._C._functorch.peek_interpreter_stack()
    if interpreter is not None:
        return (f"inside a torch.func transform ({interpreter.key().name}: vmap, grad, jvp, functionalize, ...), where torch "
                "forbids writing a tensor's .data")
    for name, key in torch._C._TorchDispatchModeKey.__members__.items():
        if torch._C._get_dispatch_mode(key) is not None:
            return (f"under torch's {name.lower()} dispatch mode ({type(torch._C._get_dispatch_mode(key)).__name__}, as "
                    "make_fx, torch.export and FakeTensorMode set), where tensor operations are recorded or make no "
                    "real values")
    if torch._C._get_tracing_state() is not None:
        return "inside torch.jit.trace, which would record the casts into the traced graph"
    return None


def set_data(t: torch.Tensor, data: torch.Tensor) -> None:
    """``t.data = data``, keeping ``t`` an inference tensor exactly when it was one.

    An inference tensor has no version counter (and a normal one made under ``inference_mode``
    would lose its own): where ``data`` was made in the other mode, it is copied in ``t``'s.
    """
    if data.is_inference() != t.is_inference():
        with torch.inference_mode(t.is_inference()):
            data = data.clone()
    t.data = data


def kind(t: torch.Tensor) -> str:
    """One of :data:`KINDS` (a subclass is the kind of the values it holds; a fake tensor is ``meta``)."""
    if _no_values(t):
        return "meta"
    if t.is_quantized:
        return "quantized"
    if t.is_complex():
        return "complex"
    if not t.is_floating_point():
        return "integer"
    return "floating" if t.layout in (torch.strided, torch.jagged, torch._mkldnn) else "sparse"


def castable(t: torch.Tensor) -> bool:
    """Whether a policy casts ``t`` to another storage dtype (meta, fake and mkldnn ones are then
    refused: :func:`refusal`). Left: all but floating tensors, quantized ones, the compressed sparse
    layouts (CSR, CSC, BSR, BSC: torch's ``.data =`` relabels their dtype but keeps their values, a
    tensor that is neither) and bit-packed dtypes torch converts to nothing (``float4_e2m1fn_x2``)."""
    return (t.is_floating_point() and not t.is_quantized and t.layout not in _COMPRESSED
            and converts(t.dtype, t.device.type))


def _parts(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """The plain strided tensors that hold ``t``'s data (none for a meta or fake tensor)."""
    if _no_values(t):
        return
    if _wrapper(t):
        names, _ = t.__tensor_flatten__()
        for name in names:
            inner = getattr(t, name)
            if isinstance(inner, torch.Tensor):  # a DTensor also names its device mesh
                yield from _parts(inner)
        return
    if _nested(t):
        for component in t.data.unbind():
            yield from _parts(component)
        return
    # .data, not .detach(): a fresh version counter (a parameter made under inference_mode has none,
    # whatever data the app puts in it later, and torch then refuses any view of it)
    t = t.data
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)  # a __torch_function__ subclass: its own storage, read as plain
    if t.layout == torch.sparse_coo:
        yield t._indices()
        yield t._values()
    elif t.layout in _COMPRESSED:
        for name in _COMPRESSED[t.layout]:
            yield getattr(t, name)()
        yield t.values()
    elif t.is_quantized:
        yield t.int_repr()
    elif t.layout == torch._mkldnn:
        yield t.to_dense()
    else:
        yield t


def stored_bytes(t: torch.Tensor) -> int:
    """Bytes ``t`` holds: a sparse tensor's indices and values, nothing for a meta tensor."""
    return sum(p.numel() * p.element_size() for p in _parts(t))


def stored_elements(t: torch.Tensor) -> int:
    """Values ``t`` stores (a sparse tensor's non-zeros; a meta tensor's shape): for shares of the weights."""
    if _nested(t):
        return sum(p.numel() for p in _parts(t))
    if t.is_meta or t.layout in (torch.strided, torch._mkldnn) or _wrapper(t):
        return t.numel()
    return (t._values() if t.layout == torch.sparse_coo else t.values()).numel()


def sample(t: torch.Tensor, n: int = 64) -> torch.Tensor:
    """Up to ``n`` evenly spaced values of each part of ``t``, as float64 on the CPU.

    Bit-exact for 16- and 32-bit floats; a complex tensor gives its real and imaginary
    parts, a quantized one its dequantized values; a meta or fake tensor gives none.
    """
    if _no_values(t):
        return torch.zeros(0, dtype=torch.float64)
    if t.is_quantized and not _wrapper(t):
        parts: list[torch.Tensor] = [t.data.dequantize()]
    else:
        parts = list(_parts(t))
    out = []
    for part in parts:
        if not converts(part.dtype, part.device.type):  # a bit-packed dtype: its bytes, as integers
            part = part.view(_SAME_SIZE_INTS[part.element_size()])
        part = part.resolve_conj().resolve_neg()
        if part.is_complex():
            part = torch.view_as_real(part)
        flat = part.reshape(-1)
        if flat.numel():
            step = max(1, flat.numel() // n)
            out.append(flat[::step][:n].to("cpu", torch.float64))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def digest(t: torch.Tensor, n: int = 4096) -> bytes:
    """A cheap fingerprint of ``t``'s values: its dtype, device, shape and :func:`sample` of ``n``."""
    shape = tuple(tuple(p.shape) for p in _parts(t)) if _nested(t) else tuple(t.shape)
    return repr((t.dtype, t.device, shape)).encode() + sample(t, n).numpy().tobytes()


def fits_file(t: torch.Tensor) -> bool:
    """Whether ``t``'s values can go to a safetensors file as they are (dense, plain storage)."""
    return t.layout == torch.strided and not _no_values(t) and not t.is_quantized and not _wrapper(t) and not t.is_nested


def deepcopy_refused(t: torch.Tensor) -> bool:
    """Whether torch's own ``copy.deepcopy`` refuses ``t``: a sparse parameter (it clones with
    ``preserve_format``), a compressed sparse tensor (it reads the storage) or a ``__torch_function__``
    subclass that is not an ``nn.Parameter`` subclass (its ``new_empty`` is not of its type); a
    non-leaf tensor (a buffer computed with ``requires_grad``), a nested or a zero tensor."""
    if t.grad_fn is not None or _nested(t) or t._is_zerotensor():
        return True
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
