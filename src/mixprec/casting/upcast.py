"""Upcast attention: compute attention scores and softmax in fp32 inside chosen modules.

Attention takes many paths: transformers' eager attention (``torch.matmul`` of Q and
Kᵀ, then softmax), diffusers' classic processors (``baddbmm`` / ``bmm``), explicit
``q @ k.transpose(-2, -1)`` in user modules, and ``scaled_dot_product_attention``.
A :class:`torch.overrides.TorchFunctionMode` active only while an attention module
runs catches all of them: matmul-family calls with 16-bit operands run in fp32,
softmax runs in fp32, SDPA runs with fp32 q/k/v (only where a measured check says
the 16-bit kernel overflows), and a ``linear`` that receives the fp32 result casts it
back to its weight's dtype, so the module's output projection keeps working.
"""

from __future__ import annotations

import functools
import re

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

__all__ = ["UpcastAttentionMode", "sdpa_overflows", "sdpa_upcast_table", "is_attention_module"]

_HALF = (torch.float16, torch.bfloat16)
# Dicts, not sets: ``func in`` a set of functions breaks the graph under torch < 2.7's
# Dynamo (it cannot trace a set's ``__contains__``); a dict's is traced on 2.6 - 2.13.
_MATMULS = dict.fromkeys((
    torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__,
    torch.bmm, torch.Tensor.bmm, torch.baddbmm, torch.Tensor.baddbmm, torch.einsum,
))
_SOFTMAX = dict.fromkeys((torch.softmax, torch.Tensor.softmax, F.softmax, torch.nn.functional.softmax))
_ATTENTION_NAME = re.compile(r"attention|attn", re.IGNORECASE)


def is_attention_module(module: nn.Module) -> bool:
    """Whether ``module``'s class looks like an attention block (``*Attention*`` / ``*Attn*``)."""
    return bool(_ATTENTION_NAME.search(type(module).__name__)) and not isinstance(module, (nn.Linear, nn.Dropout))


def _up(obj):
    if isinstance(obj, torch.Tensor) and obj.dtype in _HALF:
        return obj.float()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_up(o) for o in obj)
    return obj


def _has_half(args) -> bool:
    return any(isinstance(a, torch.Tensor) and a.dtype in _HALF for a in args) or any(
        isinstance(a, (list, tuple)) and _has_half(a) for a in args
    )


@functools.lru_cache(maxsize=None)
def sdpa_overflows(device_type: str, dtype: torch.dtype) -> bool:
    """Measure whether 16-bit SDPA on this device overflows where fp32 does not.

    Scores near 1e6 exceed fp16's range (65,504). Kernels that accumulate in fp32
    (the fused and math CPU kernels in torch 2.13) stay finite; then upcasting SDPA
    only costs time. The check runs once per device type and dtype.
    """
    if dtype not in _HALF or device_type == "meta":
        return False
    gen = torch.Generator(device="cpu").manual_seed(0)
    q = torch.full((1, 1, 4, 64), 125.0) + torch.rand(1, 1, 4, 64, generator=gen)
    k = torch.full((1, 1, 4, 64), 125.0) + torch.rand(1, 1, 4, 64, generator=gen)
    v = torch.randn(1, 1, 4, 64, generator=gen)
    reference = F.scaled_dot_product_attention(q, k, v, scale=1.0)
    try:
        out = F.scaled_dot_product_attention(
            q.to(device_type, dtype), k.to(device_type, dtype), v.to(device_type, dtype), scale=1.0
        ).float().cpu()
    except RuntimeError:
        return True  # no 16-bit kernel: upcasting is the only way to run it
    if not torch.isfinite(out).all():
        return True
    tol = 5e-2 if dtype == torch.bfloat16 else 1e-2
    return not torch.allclose(out, reference, atol=tol, rtol=tol)


def sdpa_upcast_table(device_types: set[str]) -> dict[tuple[str, torch.dtype], bool]:
    """:func:`sdpa_overflows` measured now for these device types and both 16-bit dtypes.

    The mode reads this table instead of measuring while it runs: a measurement made
    inside a ``torch.compile`` region (it builds a ``torch.Generator``) breaks the graph.
    """
    return {(d, dtype): sdpa_overflows(d, dtype) for d in device_types for dtype in _HALF}


class UpcastAttentionMode(TorchFunctionMode):
    """Run the score path of attention in fp32 while active (see module docstring).

    Args:
        sdpa_upcast: ``{(device type, dtype): upcast?}`` for SDPA, measured beforehand
            (:func:`sdpa_upcast_table`); a pair missing from it is measured on first use.
    """

    def __init__(self, sdpa_upcast: dict[tuple[str, torch.dtype], bool] | None = None) -> None:
        super().__init__()
        self.sdpa_upcast = sdpa_upcast or {}

    def _sdpa_overflows(self, device_type: str, dtype: torch.dtype) -> bool:
        known = self.sdpa_upcast.get((device_type, dtype))
        return sdpa_overflows(device_type, dtype) if known is None else known

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _MATMULS and _has_half(args):
            return func(*_up(args), **kwargs)
        if func in _SOFTMAX:
            if args and isinstance(args[0], torch.Tensor) and args[0].dtype in _HALF and kwargs.get("dtype") is None:
                return func(args[0].float(), *args[1:], **kwargs)
            return func(*args, **kwargs)
        if func is F.scaled_dot_product_attention:
            q = args[0] if args else kwargs.get("query")
            if isinstance(q, torch.Tensor) and q.dtype in _HALF and self._sdpa_overflows(q.device.type, q.dtype):
                up_args = _up(args)
                up_kwargs = {k: (_up(v) if k in ("query", "key", "value", "attn_mask") else v) for k, v in kwargs.items()}
                return func(*up_args, **up_kwargs).to(q.dtype)
            return func(*args, **kwargs)
        if func is F.linear:
            x = args[0] if args else kwargs.get("input")
            w = args[1] if len(args) > 1 else kwargs.get("weight")
            if isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and x.dtype != w.dtype and w.is_floating_point():
                if args:
                    args = (x.to(w.dtype),) + tuple(args[1:])
                else:
                    kwargs = dict(kwargs, input=x.to(w.dtype))
            return func(*args, **kwargs)
        return func(*args, **kwargs)
