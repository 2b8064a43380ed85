"""Computing in one dtype from weights stored in another, without touching the stored parameters.

A module stored in 16 bits that computes in fp32, or stored in fp8 that computes in bf16
(:mod:`mixprec.casting.fp8`), gets a ``forward`` that reads copies of its own weights in
its compute dtype. Nothing is written to a parameter: the copies are ordinary
tensors made inside the call, so ``torch.compile`` traces them as part of the graph
(an earlier version swapped ``param.data`` for the call, which Dynamo cannot trace and
which broke the graph at every such layer), revert has nothing to undo in the weights,
and a compiled graph holds no fp32 copy between calls: inductor takes the parameters
as graph inputs and makes the copies per call.

The common layers get a functional forward of their own (the same ``torch.nn.functional``
call their class makes, with the weights upcast): ``Linear``, ``Conv1d/2d/3d`` and their
transposes, ``Embedding``, ``LayerNorm``, ``GroupNorm``, ``RMSNorm`` and ``BatchNorm`` in
inference. Every other module (an LSTM, a custom module with its own ``nn.Parameter``)
runs its own forward with its parameters temporarily replaced by the upcast copies
(:func:`torch.nn.utils.stateless._reparametrize_module`, what
:func:`torch.func.functional_call` uses).

Floating inputs are cast to the compute dtype too: code that casts its input to the
parameters' storage dtype (``x.to(self.dtype)``) would otherwise hand a 16-bit tensor
to fp32 weights, which many kernels refuse.
"""

from __future__ import annotations

import functools
import threading
import warnings
import weakref
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.utils import stateless

from mixprec.casting.fp8 import Fp8Weight, dequantise, entry_of, is_fp8
from mixprec.casting.hooks import ForwardWrapper, add_method_hook, cast_floats, own_tensors
from mixprec.casting.meet import OP_ERRORS, float_dtypes, may_be_about_dtypes
from mixprec.policy.tree import entry_methods

__all__ = ["ComputeIn", "Fp8InputWarning", "fp32_forward_kind", "stored_elsewhere", "weight_layer"]

_CASTABLE = (torch.float16, torch.bfloat16, torch.float32)

#: Modules computing in another dtype than their weights are stored in, and their wrapper: a
#: reader of a descendant's weights (below) widens only those whose own forward would widen them.
_COMPUTING: weakref.WeakKeyDictionary[nn.Module, "ComputeIn"] = weakref.WeakKeyDictionary()

#: ``up(name)``: the module's tensor ``name`` as the module computes with it (``None`` stays ``None``).
Up = Callable[..., Any]


def _linear(m: nn.Linear, up: Up, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, up("weight"), up("bias"))


def _conv(m: nn.Conv2d, up: Up, x: torch.Tensor) -> torch.Tensor:
    return m._conv_forward(x, up("weight"), up("bias"))


_TRANSPOSED: dict[type, tuple[int, Callable[..., torch.Tensor]]] = {
    nn.ConvTranspose1d: (1, F.conv_transpose1d),
    nn.ConvTranspose2d: (2, F.conv_transpose2d),
    nn.ConvTranspose3d: (3, F.conv_transpose3d),
}


def _conv_transpose(spatial: int, fn: Callable[..., torch.Tensor], m: nn.ConvTranspose2d, up: Up, x: torch.Tensor,
                    output_size: list[int] | None = None) -> torch.Tensor:
    output_padding = m._output_padding(x, output_size, m.stride, m.padding, m.kernel_size, spatial, m.dilation)
    return fn(x, up("weight"), up("bias"), m.stride, m.padding, output_padding, m.groups, m.dilation)


def _embedding(m: nn.Embedding, up: Up, ids: torch.Tensor) -> torch.Tensor:
    # A lookup copies rows: gathering the stored rows and widening them gives exactly the
    # rows of a widened table, without widening the whole table (a 30,522 x 384
    # vocabulary is 47 MB of fp32 per call) for the few rows a call reads. An fp8 table's
    # rows are gathered with their scales (``up`` of the gathered rows would not know them).
    return up("weight", rows=lambda table: F.embedding(ids, table, m.padding_idx, None, m.norm_type,
                                                       m.scale_grad_by_freq, m.sparse), ids=ids)


def _layer_norm(m: nn.LayerNorm, up: Up, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, m.normalized_shape, up("weight"), up("bias"), m.eps)


def _group_norm(m: nn.GroupNorm, up: Up, x: torch.Tensor) -> torch.Tensor:
    return F.group_norm(x, m.num_groups, up("weight"), up("bias"), m.eps)


def _rms_norm(m: nn.RMSNorm, up: Up, x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, m.normalized_shape, up("weight"), m.eps)


def _batch_norm(m: _BatchNorm, up: Up, x: torch.Tensor) -> torch.Tensor:
    m._check_input_dim(x)
    return F.batch_norm(x, up("running_mean"), up("running_var"), up("weight"), up("bias"), False, 0.0, m.eps)


def stored_elsewhere(t: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether ``t`` is a 16/32-bit or fp8 tensor stored in another dtype than ``dtype``: a module
    computing in ``dtype`` reads it through a converted copy (:class:`ComputeIn`)."""
    return t.dtype != dtype and (t.dtype in _CASTABLE or is_fp8(t.dtype))


def weight_layer(module: nn.Module) -> bool:
    """``Linear``, a convolution or transposed convolution, or ``Embedding`` (torch's classes or subclasses)."""
    return isinstance(module, (nn.Linear, nn.modules.conv._ConvNd, nn.Embedding))


def fp32_forward_kind(module: nn.Module) -> Callable[..., torch.Tensor] | None:
    """The functional forward for ``module`` (called as ``fn(module, up, *args)``), or
    ``None`` when it needs the generic path.

    Chosen by the class's ``forward`` (a subclass that overrides it, such as a LoRA
    layer, takes the generic path) and by the options the functional form covers.
    """
    forward = type(module).forward
    if forward is nn.Linear.forward:
        return _linear
    if forward in (nn.Conv1d.forward, nn.Conv2d.forward, nn.Conv3d.forward):
        return _conv
    for cls, (spatial, fn) in _TRANSPOSED.items():
        if forward is cls.forward and module.padding_mode == "zeros":
            return functools.partial(_conv_transpose, spatial, fn)  # resolved once, not per call
    if forward is nn.Embedding.forward and module.max_norm is None:  # max_norm renormalises the weight in place
        return _embedding
    if forward is nn.LayerNorm.forward:
        return _layer_norm
    if forward is nn.GroupNorm.forward:
        return _group_norm
    if hasattr(nn, "RMSNorm") and forward is nn.RMSNorm.forward:
        return _rms_norm
    if forward is _BatchNorm.forward and module.track_running_stats and module.running_mean is not None:
        return _batch_norm  # inference only: see ComputeIn.install
    return None


class ComputeIn(ForwardWrapper):
    """Wrap a module's ``forward`` so that it computes in ``dtype`` from weights stored in another.

    fp32 from 16-bit weights (``compute = "fp32"``), bf16 or fp16 from fp8 weights
    (dequantised with their scales, :mod:`mixprec.casting.fp8`), or any other pair a
    policy resolves to: the module's stored tensors are read through copies in ``dtype``
    made inside the call.

    Some code reads a child's weights itself instead of calling the child: torch's
    ``nn.MultiheadAttention`` hands ``out_proj.weight`` straight to
    ``F.multi_head_attention_forward``; a model's method multiplies by
    ``self.codebook.weight``. Such a reader (``reads_children``) gets copies of the
    weights of every descendant that itself computes from other stored weights, for the
    call, as the descendant's own forward would have made them. It is known for
    ``nn.MultiheadAttention`` and found for any other generic module by what happens: a
    call that fails with an op error is run again with the descendants' weights widened,
    and a success marks it.

    A module's own methods other than ``forward`` are its code too: a codebook's
    ``encode`` that finds the nearest code with ``x @ self.embed.t()``, called by its
    parent instead of ``forward``, reads copies of the module's stored tensors for the
    call, as ``forward`` does (one set of copies however the methods call each other);
    those named like torch's in-place methods (``expire_codes_``) write the stored tensors.
    """

    def __init__(self, dtype: torch.dtype = torch.float32, min_ndim: int = 0) -> None:
        self.dtype = dtype
        #: Floating inputs with fewer dimensions keep their dtype (a timestep rounded to bf16
        #: is another timestep; casting to fp32 loses nothing, so fp32 compute casts all).
        self.min_ndim = min_ndim
        self.active = False
        self.reads_children = False
        self._methods: list[Any] = []
        self._fp8_input_told = False
        self._scales: dict[str, Fp8Weight] = {}

    def up(self, name: str, rows: Callable[[torch.Tensor], torch.Tensor] | None = None,
           ids: torch.Tensor | None = None) -> Any:
        """The module's tensor ``name`` as this module computes with it: fp8 dequantised with its
        scale, 16/32-bit cast. ``rows(table)`` gathers the rows of ``ids`` first (an embedding
        lookup: only the rows read are converted)."""
        t = getattr(self.module, name)
        if t is None:
            return None
        entry = self._scales.get(name) if is_fp8(t.dtype) else None
        if rows is not None:
            gathered = rows(t)
            if entry is not None:
                return dequantise(gathered, Fp8Weight(entry.scale.to(t.device)[ids], entry.format), self.dtype)
            return self.widen(gathered, None)
        return self.widen(t, entry)

    def widen(self, t: torch.Tensor, entry: Fp8Weight | None) -> torch.Tensor:
        if entry is not None:
            return dequantise(t, entry, self.dtype)
        if is_fp8(t.dtype):  # an fp8 tensor of the model's own, not one mixprec scaled
            return t.to(self.dtype)
        return t.to(self.dtype) if t.dtype in _CASTABLE and t.dtype != self.dtype else t

    def stored_elsewhere(self, t: torch.Tensor) -> bool:
        """Whether ``t`` is stored in another dtype than this module computes in."""
        return stored_elsewhere(t, self.dtype)

    def copies(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """Copies in the compute dtype of the module's own tensors stored in another, by (prefixed) name."""
        return {f"{prefix}{key[2:]}": self.widen(t, self._scales.get(key[2:]) if key.startswith("p:") else None)
                for key, t in own_tensors(self.module) if self.stored_elsewhere(t)}

    def install(self, module: nn.Module) -> ComputeIn:
        self.module, self.previous = module, module.__dict__.get("forward")
        forward = module.forward
        functional = fp32_forward_kind(module) if self.previous is None else None
        dtype = self.dtype
        # The scales of its fp8-stored weights, by name (looked up by name: traced code reads a dict).
        self._scales = {name: entry for name, p in module._parameters.items()
                        if p is not None and (entry := entry_of(p)) is not None}

        def cast_inputs(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            # Only a layer holding fp8 weights looks (once told, never again): every other call pays nothing.
            if (self._scales and not self._fp8_input_told and not torch.compiler.is_compiling()
                    and any(is_fp8(d) for d in float_dtypes((args, kwargs)))):
                self._fp8_input_told = True
                warnings.warn(f"a {type(module).__name__} stored in fp8 was called with an fp8 input: its caller cast "
                              "its activations to the weight's dtype, rounding them to 8 bits without a scale. Keep "
                              "that module in 16 bits (a storage rule, or a keep_fp32 rule)", Fp8InputWarning, stacklevel=4)
            return (cast_floats(args, dtype, min_ndim=self.min_ndim),
                    cast_floats(kwargs, dtype, min_ndim=self.min_ndim) if kwargs else kwargs)

        # Swapping copies into the module changes it for every thread: eager calls of this
        # module on other threads wait until the copies are swapped back (traced code takes
        # no lock, which Dynamo cannot trace).
        swapping = threading.RLock()
        self.reads_children = isinstance(module, nn.MultiheadAttention)

        def swapped(args: tuple, kwargs: dict, children: bool) -> Any:
            copies = self.copies()
            if children:
                copies.update(self._descendant_copies())
            if not copies:
                return forward(*args, **kwargs)
            with stateless._reparametrize_module(module, copies):
                return forward(*args, **kwargs)

        def generic(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = cast_inputs(args, kwargs)
            if torch.compiler.is_compiling():
                return swapped(args, kwargs, self.reads_children)
            with swapping:
                if self.reads_children:
                    return swapped(args, kwargs, True)
                try:
                    return swapped(args, kwargs, False)
                except OP_ERRORS as exc:
                    if not may_be_about_dtypes(exc) or not self._descendant_copies(probe=True):
                        raise
                    try:
                        output = swapped(args, kwargs, True)
                    except OP_ERRORS:
                        raise exc from None  # not its descendants' weights: the call's own failure
                    self.reads_children = True
                    return output

        up = self.up

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return forward(*args, **kwargs)
            if functional is not None and not (functional is _batch_norm and module.training):
                args, kwargs = cast_inputs(args, kwargs)
                return functional(module, up, *args, **kwargs)
            return generic(*args, **kwargs)

        self._set(module, wrapper, forward)
        _COMPUTING[module] = self
        if functional is None:
            inside = threading.local()

            def method_hook(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
                if torch.compiler.is_compiling() or not self.active or getattr(inside, "depth", 0):
                    return call(*args, **kwargs)
                copies = self.copies()
                if not copies:
                    return call(*args, **kwargs)
                args, kwargs = cast_inputs(args, kwargs)
                inside.depth = 1
                try:
                    with swapping, stateless._reparametrize_module(module, copies):
                        return call(*args, **kwargs)
                finally:
                    inside.depth = 0

            # Methods named like torch's in-place ones (``replace_``) write the module's own
            # tensors: they run on the stored ones, not on copies a write would be lost in.
            self._methods = [add_method_hook(module, name, method_hook) for name in entry_methods(module)[1:]
                             if not name.endswith("_")]
        return self

    def _descendant_copies(self, probe: bool = False) -> dict[str, torch.Tensor]:
        """Copies of the stored tensors of descendants that compute in another dtype (by
        dotted name), each as that descendant computes; with ``probe``, only whether there
        is any (nothing is copied)."""
        copies: dict[str, torch.Tensor] = {}
        for name, sub in self.module.named_modules():
            wrapper = _COMPUTING.get(sub) if sub is not self.module else None
            if wrapper is None or not wrapper.active:
                continue
            if probe:
                if any(wrapper.stored_elsewhere(t) for _, t in own_tensors(sub)):
                    return {name: sub}  # type: ignore[dict-item]
                continue
            copies.update(wrapper.copies(prefix=f"{name}."))
        return copies

    def remove(self) -> None:
        super().remove()
        for handle in self._methods:
            handle.remove()
        self._methods = []
        if _COMPUTING.get(self.module) is self:
            del _COMPUTING[self.module]


class Fp8InputWarning(UserWarning):
    """An fp8-stored layer received an fp8 activation: its caller cast its input to the weight's dtype."""
