"""fp16/bf16 storage, fp32 compute, without touching the stored parameters.

A module stored in 16 bits that computes in fp32 gets a ``forward`` that reads upcast
copies of its own weights. Nothing is written to a parameter: the copies are ordinary
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

Floating inputs are upcast too (losslessly): code that casts its input to the
parameters' storage dtype (``x.to(self.dtype)``) would otherwise hand a 16-bit tensor
to fp32 weights, which many kernels refuse.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.utils import stateless

from mixprec.casting.hooks import ForwardWrapper, add_method_hook, cast_floats, own_tensors
from mixprec.casting.meet import OP_ERRORS, may_be_about_dtypes
from mixprec.policy.tree import entry_methods

__all__ = ["Fp32Compute", "fp32_forward_kind"]

_HALF = (torch.float16, torch.bfloat16)

#: Modules computing in fp32 from 16-bit weights, and their wrapper: a reader of a
#: descendant's weights (below) widens only those whose own forward would widen them.
_COMPUTING: weakref.WeakKeyDictionary[nn.Module, "Fp32Compute"] = weakref.WeakKeyDictionary()


def _up(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else (t.float() if t.dtype in _HALF else t)


def _linear(m: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, _up(m.weight), _up(m.bias))


def _conv(m: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    return m._conv_forward(x, _up(m.weight), _up(m.bias))


_TRANSPOSED: dict[type, tuple[int, Callable[..., torch.Tensor]]] = {
    nn.ConvTranspose1d: (1, F.conv_transpose1d),
    nn.ConvTranspose2d: (2, F.conv_transpose2d),
    nn.ConvTranspose3d: (3, F.conv_transpose3d),
}


def _conv_transpose(spatial: int, fn: Callable[..., torch.Tensor], m: nn.ConvTranspose2d, x: torch.Tensor,
                    output_size: list[int] | None = None) -> torch.Tensor:
    output_padding = m._output_padding(x, output_size, m.stride, m.padding, m.kernel_size, spatial, m.dilation)
    return fn(x, _up(m.weight), _up(m.bias), m.stride, m.padding, output_padding, m.groups, m.dilation)


def _embedding(m: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    # A lookup copies rows: gathering the 16-bit rows and widening them gives exactly the
    # rows of a widened table, without widening the whole table (a 30,522 x 384
    # vocabulary is 47 MB of fp32 per call) for the few rows a call reads.
    return _up(F.embedding(ids, m.weight, m.padding_idx, None, m.norm_type, m.scale_grad_by_freq, m.sparse))


def _layer_norm(m: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, m.normalized_shape, _up(m.weight), _up(m.bias), m.eps)


def _group_norm(m: nn.GroupNorm, x: torch.Tensor) -> torch.Tensor:
    return F.group_norm(x, m.num_groups, _up(m.weight), _up(m.bias), m.eps)


def _rms_norm(m: nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, m.normalized_shape, _up(m.weight), m.eps)


def _batch_norm(m: _BatchNorm, x: torch.Tensor) -> torch.Tensor:
    m._check_input_dim(x)
    return F.batch_norm(x, _up(m.running_mean), _up(m.running_var), _up(m.weight), _up(m.bias), False, 0.0, m.eps)


def fp32_forward_kind(module: nn.Module) -> Callable[..., torch.Tensor] | None:
    """The functional fp32 forward for ``module``, or ``None`` when it needs the generic path.

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
        return _batch_norm  # inference only: see Fp32Compute.install
    return None


class Fp32Compute(ForwardWrapper):
    """Wrap a module's ``forward`` so that it computes in fp32 from its 16-bit weights.

    Some code reads a child's weights itself instead of calling the child: torch's
    ``nn.MultiheadAttention`` hands ``out_proj.weight`` straight to
    ``F.multi_head_attention_forward``; a model's method multiplies by
    ``self.codebook.weight``. Such a reader (``reads_children``) gets fp32 copies of the
    16-bit weights of every descendant that itself computes in fp32, for the call, as the
    descendant's own forward would have. It is known for ``nn.MultiheadAttention`` and
    found for any other generic module by what happens: a call that fails with an op
    error is run again with the descendants' weights widened, and a success marks it.

    A module's own methods other than ``forward`` are its code too: a codebook's
    ``encode`` that finds the nearest code with ``x @ self.embed.t()``, called by its
    parent instead of ``forward``, reads fp32 copies of the module's 16-bit tensors for
    the call, as ``forward`` does (one set of copies however the methods call each other);
    those named like torch's in-place methods (``expire_codes_``) write the stored tensors.
    """

    def __init__(self) -> None:
        self.active = False
        self.reads_children = False
        self._methods: list[Any] = []

    def install(self, module: nn.Module) -> Fp32Compute:
        self.module, self.previous = module, module.__dict__.get("forward")
        forward = module.forward
        functional = fp32_forward_kind(module) if self.previous is None else None

        def upcast_inputs(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            return cast_floats(args, torch.float32), (cast_floats(kwargs, torch.float32) if kwargs else kwargs)

        # Swapping fp32 copies into the module changes it for every thread: eager calls of
        # this module on other threads wait until the copies are swapped back (traced code
        # takes no lock, which Dynamo cannot trace).
        swapping = threading.RLock()
        self.reads_children = isinstance(module, nn.MultiheadAttention)

        def swapped(args: tuple, kwargs: dict, children: bool) -> Any:
            copies = {key[2:]: t.float() for key, t in own_tensors(module) if t.dtype in _HALF}  # "p:weight" -> "weight"
            if children:
                copies.update(self._descendant_copies())
            if not copies:
                return forward(*args, **kwargs)
            with stateless._reparametrize_module(module, copies):
                return forward(*args, **kwargs)

        def generic(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = upcast_inputs(args, kwargs)
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

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return forward(*args, **kwargs)
            if functional is not None and not (functional is _batch_norm and module.training):
                args, kwargs = upcast_inputs(args, kwargs)
                return functional(module, *args, **kwargs)
            return generic(*args, **kwargs)

        self._set(module, wrapper, forward)
        _COMPUTING[module] = self
        if functional is None:
            inside = threading.local()

            def method_hook(call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
                if torch.compiler.is_compiling() or not self.active or getattr(inside, "depth", 0):
                    return call(*args, **kwargs)
                copies = {key[2:]: t.float() for key, t in own_tensors(module) if t.dtype in _HALF}
                if not copies:
                    return call(*args, **kwargs)
                args, kwargs = upcast_inputs(args, kwargs)
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
        """fp32 copies of the 16-bit tensors of descendants that compute in fp32 (by dotted
        name); with ``probe``, only whether there is any (nothing is copied)."""
        copies: dict[str, torch.Tensor] = {}
        for name, sub in self.module.named_modules():
            wrapper = _COMPUTING.get(sub) if sub is not self.module else None
            if wrapper is None or not wrapper.active:
                continue
            for key, t in own_tensors(sub):
                if t.dtype in _HALF:
                    if probe:
                        return {name: t}
                    copies[f"{name}.{key[2:]}"] = t.float()
        return copies

    def remove(self) -> None:
        super().remove()
        for handle in self._methods:
            handle.remove()
        self._methods = []
        if _COMPUTING.get(self.module) is self:
            del _COMPUTING[self.module]

