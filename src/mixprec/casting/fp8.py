"""fp8 weight storage: 8-bit weights with a scale per output channel, computed in 16 or 32 bits.

A module planned with ``storage = "fp8"`` (``float8_e4m3fn``) or ``"fp8-e5m2"`` keeps
the weight of each of torch's own ``Linear``, convolution (and transposed convolution)
and ``Embedding`` layers in 8 bits, one fp32 scale per row of the weight (an output
channel; an embedding's token): the scale maps the row's largest magnitude onto the
format's largest finite value, and is itself rounded up to a bf16 number, so that
dequantising in bf16 rounds once, exactly as in fp32. Everything else the module owns
(a bias, a norm's weight, buffers) is stored in the module's compute dtype.

Each forward dequantises the weight into the compute dtype (bf16 unless a rule says
``compute``), inside the layer's own functional forward (:mod:`mixprec.casting.fp32compute`):
nothing is written to the parameter, the copy lives for the call only, and the
Parameter object keeps its identity, so tied weights stay tied and revert is the same
bit-exact put-back as for 16-bit storage. On a CPU the conversion is done on the bits
(torch's own ``float8 -> bf16`` conversion is scalar there, about five times slower).

Weights that model code reads itself stay in the compute dtype (:func:`dtype_read_weights`):
a model that casts its inputs to an fp8 ``weight.dtype`` would round its activations to
8 bits without a scale, and one that multiplies by ``self.embedding.weight`` would use
values without their scale. That is the first floating parameter of every module with a
``dtype`` property (``transformers``' and ``diffusers``' models, an app's own), and every
weight the methods of a module's class read as ``self.child.weight`` or whose dtype they
read (``self.child.weight.dtype``, ``self.child.dtype``, ``next(self.child.parameters()).dtype``).

Scales count in the weight bytes (:func:`scale_bytes`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Iterable

import torch
from torch import nn

from mixprec.casting.hooks import pin_own

__all__ = ["FP8_DTYPES", "is_fp8", "Fp8Weight", "quantise", "dequantise", "entry_of", "register", "unregister",
           "scale_bytes", "stored_value", "pin_fp8", "MIN_ELEMENTS"]

#: Policy names of the fp8 storage formats.
FP8_DTYPES: dict[str, torch.dtype] = {"fp8": torch.float8_e4m3fn, "fp8-e5m2": torch.float8_e5m2}
_FORMATS = frozenset(FP8_DTYPES.values())
#: Weights with fewer values stay in the compute dtype: their scales would cost as much as they save.
MIN_ELEMENTS = 64

# (bit mask, exponent shift) that place an fp8 number's bits into a bf16 / fp32 number:
# the value read is the fp8 value times 2**(fp8 bias - target bias).
_SHIFTS = {torch.float8_e4m3fn: (4, 0x87F0, 20, 0x87F00000, 120), torch.float8_e5m2: (5, 0x8FE0, 21, 0x8FE00000, 112)}


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in _FORMATS


@dataclass(eq=False)
class Fp8Weight:
    """The scale of one fp8-stored weight and what dequantising it needs.

    Attributes:
        scale: fp32, one value per row (shape ``(rows, 1, ...)``); each a bf16 number.
        format: ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``.
    """

    scale: torch.Tensor
    format: torch.dtype
    _factors: dict[tuple[torch.dtype, torch.device, bool], torch.Tensor] = field(default_factory=dict, repr=False)
    _bits_ok: bool | None = field(default=None, repr=False)

    def factor(self, dtype: torch.dtype, device: torch.device, bits: bool = False) -> torch.Tensor:
        """The scale in ``dtype`` on ``device``; with ``bits``, times 2**(127 - fp8 bias) for :func:`dequantise`'s bit path."""
        key = (dtype, device, bits)
        found = self._factors.get(key)
        if found is None:
            scale = self.scale.to(device)
            if bits:
                scale = scale * 2.0 ** _SHIFTS[self.format][4]
            found = self._factors[key] = scale.to(dtype)
        return found

    @property
    def bits_ok(self) -> bool:
        """The bit path's factor is finite in bf16 (every scale below 2**(255 - 127 - shift)): true for any real weight."""
        if self._bits_ok is None:
            self._bits_ok = bool(self.scale.max() < 2.0 ** (127 - _SHIFTS[self.format][4]))
        return self._bits_ok

    def rescale(self, scale: torch.Tensor) -> None:
        """Take the scale of newly quantised values (the app loaded new weights)."""
        self.scale.copy_(scale)
        self._factors.clear()
        self._bits_ok = None

    @property
    def nbytes(self) -> int:
        return self.scale.numel() * self.scale.element_size()


#: The scale of every fp8-stored parameter, by ``id`` with a weak reference to it (tensors
#: compare by value, so a ``WeakKeyDictionary`` cannot hold them).
_ENTRIES: dict[int, tuple[weakref.ref, Fp8Weight]] = {}


def entry_of(t: torch.Tensor) -> Fp8Weight | None:
    """The scale of an fp8-stored parameter, ``None`` for any other tensor."""
    if not is_fp8(t.dtype):
        return None
    found = _ENTRIES.get(id(t))
    return found[1] if found is not None and found[0]() is t else None


def register(t: torch.Tensor, entry: Fp8Weight) -> None:
    key = id(t)
    _ENTRIES[key] = (weakref.ref(t, lambda _, key=key: _ENTRIES.pop(key, None)), entry)


def unregister(t: torch.Tensor) -> None:
    found = _ENTRIES.get(id(t))
    if found is not None and found[0]() is t:
        del _ENTRIES[id(t)]


def scale_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the scales of the fp8-stored tensors among ``tensors``."""
    return sum(entry.nbytes for t in tensors if (entry := entry_of(t)) is not None)


def quantise(t: torch.Tensor, fmt: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(fp8 values, fp32 scale per row)`` for ``t``, or ``None`` where it holds a non-finite value.

    The scale of a row is its absmax over the format's largest finite value, rounded up
    to a bf16 number; an all-zero row gets 1.
    """
    with torch.no_grad():
        wide = t.detach().float()
        if not bool(torch.isfinite(wide).all()):
            return None
        rows = wide.reshape(wide.shape[0], -1) if wide.dim() > 1 else wide.reshape(-1, 1)
        amax = rows.abs().amax(dim=1)
        scale = torch.where(amax > 0, amax / torch.finfo(fmt).max, torch.ones_like(amax))
        rounded = scale.to(torch.bfloat16).float()
        # round up to the next bf16 number where rounding went down: no value may pass the format's max
        up = (rounded.view(torch.int32) + (1 << 16)).view(torch.float32)
        scale = torch.where(rounded < scale, up, rounded)
        scale = scale.reshape((-1,) + (1,) * (wide.dim() - 1))
        values = (wide / scale).clamp(-torch.finfo(fmt).max, torch.finfo(fmt).max).to(fmt)
    return values, scale


def dequantise(values: torch.Tensor, entry: Fp8Weight, dtype: torch.dtype) -> torch.Tensor:
    """``values * scale`` in ``dtype``, rounded once (as the fp32 product rounded to ``dtype``)."""
    if (values.device.type == "cpu" and dtype in (torch.bfloat16, torch.float32) and not torch.compiler.is_compiling()
            and entry.bits_ok):
        # torch converts float8 to 16/32 bits one value at a time on a CPU; on the bits it is a
        # shift and a mask: the fp8 number read as a bf16 (fp32) one is its value times
        # 2**(fp8 bias - 127), which the factor (scale * 2**(127 - fp8 bias)) takes back.
        # One buffer, written in place: no temporaries per call (a decode step dequantises every
        # layer; freed temporaries of many sizes fragment the CPU heap and raise the peak RSS).
        shift16, mask16, shift32, mask32, _ = _SHIFTS[entry.format]
        signed = values.view(torch.int8)
        if dtype == torch.bfloat16:
            bits = signed.to(torch.int16).bitwise_left_shift_(shift16).bitwise_and_(mask16 - (1 << 16))
        else:
            bits = signed.to(torch.int32).bitwise_left_shift_(shift32).bitwise_and_(mask32 - (1 << 32))
        return bits.view(dtype).mul_(entry.factor(dtype, values.device, bits=True))
    if torch.compiler.is_compiling():  # one fused kernel under inductor
        return (values.float() * entry.scale.to(values.device)).to(dtype)
    if dtype == torch.bfloat16:  # a bf16 scale times an fp8 value is exact in fp32: one rounding
        return values.to(dtype) * entry.factor(dtype, values.device)
    return (values.float() * entry.factor(torch.float32, values.device)).to(dtype)


def pin_fp8(module: nn.Module) -> bool:
    """Make ``module._apply`` keep its fp8-stored tensors in fp8 (``model.half()``,
    ``model.to(torch.bfloat16)`` would convert them without their scales); moves to another
    device still move them. Returns whether the module has any."""
    own = {id(t) for t in [*module._parameters.values(), *module._buffers.values()] if t is not None and entry_of(t) is not None}
    if own:
        pin_own(module, own, lambda t, out: t.to(device=out.device) if out.dtype != t.dtype else out)
    return bool(own)


def stored_value(t: torch.Tensor) -> torch.Tensor:
    """What a stored tensor holds: an fp8-stored one dequantised to fp32, any other as it is."""
    entry = entry_of(t)
    return t.detach() if entry is None else dequantise(t.detach(), entry, torch.float32)
