"""Which weights an fp8 policy stores in fp8, and the fp8 side of one apply.

:mod:`mixprec.casting.fp8` holds the format (scales, exact dequantisation); this module
decides, per weight: torch's own ``Linear`` / convolution / ``Embedding`` weights go to fp8,
except those that model code reads itself (:func:`dtype_read_weights`), unless a rule names
their module; :class:`Fp8Plan` carries that decision through one apply (the scales, what
stayed out and why, new weights the app loads).
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from typing import Any

import torch
from torch import nn

from mixprec.casting.fp32compute import fp32_forward_kind, weight_layer
from mixprec.casting.fp8 import FP8_DTYPES, MIN_ELEMENTS, Fp8Weight, entry_of, quantise, register, unregister

__all__ = ["fp8_layer", "fp8_eligible", "dtype_read_weights", "Fp8Plan"]

#: The dtypes an fp8 plan's other tensors are stored in (its compute dtype).
_COMPUTE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def fp8_layer(module: nn.Module) -> bool:
    """One of torch's own layers whose weight fp8 storage covers (its own ``forward``, not a subclass's)."""
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
        quantised = quantise(t, FP8_DTYPES[name])
        names = [f"{plan.qualname}.{key[2:]}".lstrip(".") for plan, key in owned]
        if quantised is None:
            for label in names:
                self.kept[label] = "it holds inf or NaN values, which a scale cannot represent"
            return t.data.to(_COMPUTE[owned[0][0].compute_dtype])
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


