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

import ast
import functools
import inspect
import textwrap
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch
from torch import nn

__all__ = ["FP8_DTYPES", "is_fp8", "Fp8Weight", "quantise", "dequantise", "fp8_layer", "fp8_eligible", "entry_of",
           "scale_bytes", "dtype_read_weights", "MIN_ELEMENTS"]

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


def fp8_layer(module: nn.Module) -> bool:
    """One of torch's own layers whose weight fp8 storage covers (its own ``forward``, not a subclass's)."""
    from mixprec.casting.fp32compute import fp32_forward_kind, weight_layer

    return weight_layer(module) and fp32_forward_kind(module) is not None


def fp8_eligible(module: nn.Module, key: str, t: torch.Tensor) -> bool:
    """Whether tensor ``key`` (``"p:weight"``) of ``module`` can be stored in fp8."""
    return (key == "p:weight" and t.is_floating_point() and t.layout == torch.strided and not t.is_meta
            and type(t) in (torch.Tensor, nn.Parameter) and t.dim() >= 2 and t.numel() >= MIN_ELEMENTS
            and fp8_layer(module))


def dtype_read_weights(components: dict[str, nn.Module]) -> dict[int, str]:
    """Parameters (by ``id``) that model code reads itself, with where: they stay out of fp8.

    A weight stored in fp8 is only right where its layer's own forward reads it (with its
    scale). Kept out:

    * the first floating parameter of every module with a ``dtype`` property (its own,
      or transformers' / diffusers' ``ModelMixin.dtype``): models cast inputs to it;
    * the first floating parameter of every component: apps cast its inputs to its dtype
      (``unet.dtype``, a helper's ``next(unet.parameters()).dtype``);
    * what a module's class reads in its methods' code: ``self.a.weight`` (Whisper's
      decoder multiplies by ``self.token_embedding.weight.to(x.dtype)``), ``self.a.b.dtype``,
      ``next(self.parameters()).dtype`` and ``next(self.a.parameters()).dtype`` (T5 casts to
      ``self.wo.weight.dtype``), and helpers named for a dtype called on ``self`` or a child
      (``module_dtype(self)``). Reads of a weight's shape or device do not count; a class
      without source is skipped (an fp8 layer given an fp8 input then warns, once).
    """
    found: dict[int, str] = {}
    for cname, root in components.items():
        first = _first_float(root)
        if first is not None:  # apps cast a component's inputs to its dtype: module_dtype(unet), vae.dtype
            found[id(first)] = f"the first weight of component {cname or '(root)'}: the dtype apps read from it"
        for name, module in root.named_modules():
            qualname = ".".join(p for p in (cname, name) if p) or "(root)"
            cls = type(module)
            if isinstance(getattr(cls, "dtype", None), property):
                param = _first_float(module)
                if param is not None:
                    found.setdefault(id(param), f"{cls.__name__}.dtype of {qualname} reads it")
            for klass in cls.__mro__:
                for path in _class_reads(klass):
                    target = _follow_path(module, path)
                    param = _first_float(target) if isinstance(target, nn.Module) else target
                    if isinstance(param, torch.Tensor) and (path or not fp8_layer(module)):
                        read = ".".join(("self", *path))
                        found.setdefault(id(param), f"{klass.__name__} reads {read} in its own code ({qualname})")
    return found


def _first_float(module: nn.Module) -> torch.Tensor | None:
    return next((p for p in module.parameters() if p.is_floating_point()), None)


def _follow_path(module: nn.Module, path: tuple[str, ...]) -> Any:
    obj: Any = module
    for part in path:
        if isinstance(obj, nn.Module) and part in obj._modules:
            obj = obj._modules[part]
        elif isinstance(obj, nn.Module) and part in obj._parameters:
            obj = obj._parameters[part]
        else:
            return None
    return obj


#: Infrastructure whose code handles weights generically (loading, tying, initialising), not a model's forward.
_INFRASTRUCTURE = ("torch.", "transformers.modeling_utils", "transformers.generation", "transformers.integrations",
                   "transformers.utils", "diffusers.models.modeling_utils", "diffusers.configuration_utils",
                   "diffusers.loaders", "diffusers.hooks", "huggingface_hub", "accelerate", "peft")
#: Methods that run before inference (building, initialising, tying weights).
_SETUP = frozenset({"__init__", "_init_weights", "init_weights", "reset_parameters", "tie_weights", "_tie_or_clone_weights",
                    "_tie_embedding_weights", "post_init", "_initialize_weights"})
#: What a read of a weight may ask without using its values.
_METADATA = frozenset({"shape", "device", "size", "ndim", "dim", "requires_grad", "numel", "is_cuda", "is_meta"})


@functools.lru_cache(maxsize=None)
def _class_reads(klass: type) -> tuple[tuple[str, ...], ...]:
    """Paths below ``self`` whose weights (or dtype) the class's own methods read (not its base classes')."""
    if klass is object or klass.__module__.startswith(_INFRASTRUCTURE):
        return ()
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return ()
    paths: list[tuple[str, ...]] = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or _configures(func):
            continue
        parents = {id(child): node for node in ast.walk(func) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(func):
            if isinstance(node, ast.Call) and "dtype" in _called_name(node).lower():
                # a helper that reads a module's dtype: module_dtype(self), get_dtype(self.encoder)
                for arg in node.args[:1]:
                    path = _self_path(arg)
                    if path is not None:
                        paths.append(path)
            if not isinstance(node, ast.Attribute):
                continue
            if node.attr == "dtype":
                value = node.value
                # next(self.a.parameters()).dtype, next(self.parameters()).dtype
                if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "next" and value.args
                        and isinstance(value.args[0], ast.Call) and isinstance(value.args[0].func, ast.Attribute)
                        and value.args[0].func.attr == "parameters"):
                    value = value.args[0].func.value
                path = _self_path(value)
                if path is not None:
                    paths.append(path)
            elif node.attr == "weight":
                parent = parents.get(id(node))
                if isinstance(parent, ast.Attribute) and parent.attr in _METADATA:
                    continue
                path = _self_path(node)
                if path is not None and len(path) >= 2:  # a child's weight, not the module's own
                    paths.append(path)
    return tuple(dict.fromkeys(paths))


def _configures(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A method that builds or configures the module rather than running it: a known set-up
    name, or a public method other than ``forward`` that assigns attributes of ``self``
    (``fuse_projections`` building ``self.to_qkv`` from the weights it reads)."""
    if func.name in _SETUP:
        return True
    if func.name in ("forward", "__call__") or func.name.startswith("_"):
        return False
    return any(isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
               for node in ast.walk(func) if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
               for target in (node.targets if isinstance(node, ast.Assign) else [node.target]))


def _named_by_its_rule(plan: Any, policy: Any) -> bool:
    """Whether the rule that set ``plan``'s storage names its module literally (no glob, type or role)."""
    index = plan.decided_by.get("storage") if policy is not None else None
    if index is None:
        return False
    match = policy.rules[index].match
    return not any(c in match for c in "*?[") and not match.startswith(("type:", "role:")) and (
        match in (plan.qualname, *plan.aliases))


def _self_path(node: ast.AST) -> tuple[str, ...] | None:
    """``self.a.b[0].c`` as ``("a", "b", "0", "c")`` (constant indices and keys only)."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            parts.append(str(node.slice.value))
            node = node.value
        else:
            break
    if isinstance(node, ast.Name) and node.id == "self":
        return tuple(reversed(parts))  # () is self itself
    return None


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else (func.attr if isinstance(func, ast.Attribute) else "")


def pin_fp8(module: nn.Module) -> bool:
    """Make ``module._apply`` keep its fp8-stored tensors in fp8 (``model.half()``,
    ``model.to(torch.bfloat16)`` would convert them without their scales); moves to another
    device still move them. Returns whether the module has any."""
    own = {id(t) for t in [*module._parameters.values(), *module._buffers.values()] if t is not None and entry_of(t) is not None}
    if not own:
        return False
    original = module._apply

    def _apply(fn, *args, **kwargs):
        def keep(t):
            out = fn(t)
            if id(t) in own and isinstance(out, torch.Tensor) and out.dtype != t.dtype:
                return t.to(device=out.device)
            return out

        return original(keep, *args, **kwargs)

    module._apply = _apply  # type: ignore[method-assign]
    return True


class Fp8Plan:
    """The fp8 side of one apply: which tensors go to fp8, their scales, and which weights of
    fp8-planned layers stayed in their compute dtype and why (for ``explain``)."""

    def __init__(self, components: dict[str, nn.Module], plans: list[Any], policy: Any = None):
        self.active = any(p.storage in FP8_DTYPES for p in plans)
        read = dtype_read_weights(components) if self.active else {}
        # A rule naming a module itself (no glob) stores it in fp8 even where code reads its weight:
        # the user's call, made after explain said why it was kept out.
        named = {id(t) for p in plans if p.storage in FP8_DTYPES and _named_by_its_rule(p, policy)
                 for t in p.module._parameters.values() if t is not None}
        #: Weights kept out of fp8 because code reads them (by ``id``), and where.
        self.read = {tid: why for tid, why in read.items() if tid not in named}
        #: ``"qualname.weight"`` -> why that weight of an fp8-planned layer is not stored in fp8.
        self.kept: dict[str, str] = {}
        #: ``"qualname.weight"`` -> the format it is stored in.
        self.stored: dict[str, str] = {}
        self._entries: dict[int, Fp8Weight] = {}
        self._tensors: list[torch.Tensor] = []

    def tensor_storage(self, plan: Any, key: str, t: torch.Tensor) -> str:
        """The storage name for tensor ``key`` of ``plan``'s module: its plan's fp8 format for an
        eligible weight no code reads a dtype from; the compute dtype for the rest of an fp8 plan."""
        if plan.storage not in FP8_DTYPES:
            return plan.storage
        if fp8_eligible(plan.module, key, t):
            why = self.read.get(id(t))
            if why is None:
                return plan.storage
            self.kept[f"{plan.qualname}.{key[2:]}".lstrip(".")] = why
        return plan.compute_dtype

    def cast(self, t: torch.Tensor, name: str, owned: list[tuple[Any, str]]) -> torch.Tensor:
        """``t``'s fp8 values (its scale recorded), or, where it holds inf or NaN, a copy in its compute dtype."""
        from mixprec.casting.targets import DTYPES

        quantised = quantise(t, FP8_DTYPES[name])
        names = [f"{plan.qualname}.{key[2:]}".lstrip(".") for plan, key in owned]
        if quantised is None:
            for label in names:
                self.kept[label] = "it holds inf or NaN values, which a scale cannot represent"
            return t.data.to(DTYPES[owned[0][0].compute_dtype])
        values, scale = quantised
        self._entries[id(t)] = Fp8Weight(scale, FP8_DTYPES[name])
        for label in names:
            self.stored[label] = name
        return values

    def register(self, tensors: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> Fp8Plan:
        """Make the scales of the cast tensors (now holding their fp8 values) known; returns ``self``."""
        for tid, entry in self._entries.items():
            t = tensors[tid][0]
            register(t, entry)
            self._tensors.append(t)
        return self

    def requantise(self, t: torch.Tensor, value: torch.Tensor) -> bool:
        """Store ``value`` (the app's new weight) in ``t`` as fp8 with a new scale; whether ``t`` is fp8-stored."""
        entry = entry_of(t)
        if entry is None:
            return False
        quantised = quantise(value.to(t.device), entry.format)
        if quantised is None:
            raise ValueError("the new values hold inf or NaN, which fp8 with a scale cannot store")
        t.data.copy_(quantised[0])
        entry.rescale(quantised[1].to(entry.scale.device))
        return True

    def release(self) -> None:
        """Forget the scales (revert: the tensors hold their originals again)."""
        for t in self._tensors:
            unregister(t)
        self._tensors.clear()
        self._entries.clear()


def stored_value(t: torch.Tensor) -> torch.Tensor:
    """What a stored tensor holds: an fp8-stored one dequantised to fp32, any other as it is."""
    entry = entry_of(t)
    return t.detach() if entry is None else dequantise(t.detach(), entry, torch.float32)
