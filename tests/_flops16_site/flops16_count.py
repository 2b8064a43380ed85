"""The FLOPs of matrix products, convolutions and attention computed in bf16, fp16 and fp32.

A CPU without native 16-bit arithmetic (AVX2 only) emulates bf16 and fp16 at about 1/60 of
its fp32 rate, so they are what a test costs there first; fp32 FLOPs are the rest of its
arithmetic. :class:`Flops16Mode` is a ``TorchDispatchMode`` that runs every operator with
the kernels it runs without the mode and, for the operators that ``torch.utils.flop_counter``
has a formula for (plus the CPU kernels it misses, below), adds that formula's count under
the dtype of the operator's first floating-point input, when it is bf16, fp16 or fp32. Fake
and meta tensors compute nothing and count nothing.

This module imports only torch: ``sitecustomize`` loads it in subprocesses as well.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["DTYPES", "FORMULAS", "Flops16Mode"]

aten = torch.ops.aten

#: The dtypes counted, by the name the report uses.
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _n(t: Any) -> int:
    return int(t.numel()) if isinstance(t, torch.Tensor) else 0


def _flash_cpu(query, key, value, *args, **kwargs) -> int:
    """CPU's fused attention (``F.scaled_dot_product_attention`` on a CPU tensor)."""
    return flop_counter.sdpa_flop_count(query.shape, key.shape, value.shape)


def _flash_cpu_backward(grad_out, query, key, value, *args, **kwargs) -> int:
    return flop_counter.sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)


def _fused_attention(query, key, value, *args, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(query.shape, key.shape, value.shape)


def _mv(mat, vec, **kwargs) -> int:
    return 2 * _n(mat)


def _addmv(bias, mat, vec, **kwargs) -> int:
    return 2 * _n(mat)


def _addmm_activation(bias, mat1, mat2, **kwargs) -> int:
    return flop_counter.mm_flop(mat1.shape, mat2.shape)


def _addbmm(bias, batch1, batch2, **kwargs) -> int:
    return flop_counter.bmm_flop(batch1.shape, batch2.shape)


def _encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first, eps,
                   nw1, nb1, nw2, nb2, ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, *args, **kwargs) -> int:
    """``nn.TransformerEncoderLayer``'s fast path (eval, no grad): four linears and attention."""
    tokens = _n(src) // embed_dim
    linears = 2 * tokens * (_n(qkv_weight) + _n(proj_weight) + _n(ffn_weight_1) + _n(ffn_weight_2))
    length = src.shape[-2] if src.dim() == 3 else tokens
    return linears + 4 * tokens * length * embed_dim


def _native_mha(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, *args, **kwargs) -> int:
    """``nn.MultiheadAttention``'s fast path: the q, k, v and output projections and attention."""
    q_tokens, k_tokens = _n(query) // embed_dim, _n(key) // embed_dim
    k_length = key.shape[-2] if key.dim() == 3 else k_tokens
    projections = 2 * embed_dim * embed_dim * (2 * q_tokens + 2 * k_tokens)
    return projections + 4 * q_tokens * k_length * embed_dim


def _rnn_layer(input, w_ih, w_hh, *args, **kwargs) -> int:
    """One layer of an LSTM/GRU on CPU (oneDNN): both gate products at every step."""
    steps_times_batch = _n(input) // input.shape[-1]
    return 2 * steps_times_batch * (_n(w_ih) + _n(w_hh))


def _rnn_layer_backward(input, w_ih, w_hh, *args, **kwargs) -> int:
    return 2 * _rnn_layer(input, w_ih, w_hh)


_EXTRA: dict[Any, Callable[..., int]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _flash_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _flash_cpu_backward,
    aten._scaled_dot_product_fused_attention_overrideable: _fused_attention,
    aten.mv: _mv,
    aten.addmv: _addmv,
    aten._addmm_activation: _addmm_activation,
    aten.addbmm: _addbmm,
    aten._transformer_encoder_layer_fwd: _encoder_layer,
    aten._native_multi_head_attention: _native_mha,
    aten.mkldnn_rnn_layer: _rnn_layer,
    aten.mkldnn_rnn_layer_backward: _rnn_layer_backward,
}

#: Operator (overload packet, or higher-order operator) -> ``formula(*args, **kwargs, out_val=out) -> FLOPs``:
#: torch's own registry, then the CPU kernels it has no formula for.
FORMULAS: dict[Any, Callable[..., int]] = {
    **flop_counter.flop_registry,
    **{op: (lambda f: lambda *a, out_val=None, **k: f(*a, **k))(f) for op, f in _EXTRA.items()},
}


def _first_float(args: Any, kwargs: Any) -> torch.Tensor | None:
    """The first floating-point tensor among the arguments (and in their lists); aten operators
    take their tensors there, so no pytree walk is needed on every call."""
    for arg in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(arg, torch.Tensor):
            if arg.is_floating_point():
                return arg
        elif isinstance(arg, (list, tuple)):
            for item in arg:
                if isinstance(item, torch.Tensor) and item.is_floating_point():
                    return item
    return None


def _computing_dtype(args: Any, kwargs: Any) -> str | None:
    """``"bf16"``/``"fp16"``/``"fp32"`` where the first floating-point tensor input is a dense tensor
    of that dtype holding real values (not meta, fake, sparse, nested or oneDNN)."""
    first = _first_float(args, kwargs)
    if first is None:
        return None
    name = DTYPES.get(first.dtype)
    if name is None or first.layout != torch.strided or first.is_meta or first.is_nested or isinstance(first, _fake_type()):
        return None
    return name


#: The dispatch key of the C++ kernels that decompose composite operators.
_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd

#: Operator -> (its formula or None, whether it is a composite to decompose): looked up once per operator.
_PLANS: dict[Any, tuple[Callable[..., int] | None, bool]] = {}


def _plan(func: Any) -> tuple[Callable[..., int] | None, bool]:
    """``func``'s formula, and for an aten operator without one, whether it has a decomposition
    (a CompositeImplicitAutograd kernel)."""
    plan = _PLANS.get(func)
    if plan is None:
        formula = FORMULAS.get(getattr(func, "_overloadpacket", func))
        composite = (formula is None and isinstance(func, torch._ops.OpOverload) and func.namespace == "aten"
                     and torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _COMPOSITE))
        plan = _PLANS[func] = (formula, composite)
    return plan


@functools.cache
def _fake_type() -> type:
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor


class Flops16Mode(TorchDispatchMode):
    """Count the bf16, fp16 and fp32 FLOPs of everything run while the mode is on.

    Args:
        on_count: called with the dtype name and the FLOPs of every operator counted (after
            :attr:`counts` has them), in the thread that ran it.

    Attributes:
        counts: dtype name (``"bf16"``, ``"fp16"``, ``"fp32"``) -> FLOPs so far.
        by_op: operator (``aten.mm``, ...) -> its FLOPs so far, both dtypes.
        uncounted: operators whose formula failed on their arguments (name -> calls).

    Example::

        with Flops16Mode() as mode:
            torch.ones(4, 8, dtype=torch.bfloat16) @ torch.ones(8, 2, dtype=torch.bfloat16)
        assert mode.counts["bf16"] == 2 * 4 * 8 * 2
    """

    supports_higher_order_operators = True

    def __init__(self, on_count: Callable[[str, int], None] | None = None) -> None:
        super().__init__()
        self.counts = dict.fromkeys(DTYPES.values(), 0)
        self.by_op: dict[str, int] = {}
        self.uncounted: dict[str, int] = {}
        self._on_count = on_count

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile compiles as it would without the mode (the default would make it run
        # eagerly), and the compiled code's calls to aten kernels are still counted.
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        formula, composite = _plan(func)
        if formula is None and not composite:
            return func(*args, **kwargs)
        name = _computing_dtype(args, kwargs)
        if composite and name is not None:
            # Where autograd does not run (inference mode), composite operators (linear, matmul,
            # scaled_dot_product_attention, conv2d, lstm) reach the mode whole: run their C++
            # composite kernel under the mode, so the products inside are seen. That kernel is the
            # one the dispatcher runs without the mode; ``func.decompose`` would prefer a Python
            # decomposition registered for tracing where there is one, and those choose other
            # kernels (``aten.lstm``'s calls oneDNN's RNN, which has no bf16 primitive on AVX2).
            with self:
                return func._op_dk(_COMPOSITE, *args, **kwargs)
        out = func(*args, **kwargs)
        if formula is not None and name is not None:
            self._add(name, formula, func, args, kwargs, out)
        return out

    def _add(self, name: str, formula: Callable[..., int], func: Any, args: Any, kwargs: Any, out: Any) -> None:
        try:
            flops = int(formula(*args, **kwargs, out_val=out))
        except Exception:  # a formula that does not know these arguments (nested tensors, ...): reported, not guessed
            key = str(func)
            self.uncounted[key] = self.uncounted.get(key, 0) + 1
            return
        self.counts[name] += flops
        op = str(getattr(func, "_overloadpacket", func))
        self.by_op[op] = self.by_op.get(op, 0) + flops
        if self._on_count is not None:
            self._on_count(name, flops)
