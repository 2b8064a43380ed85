"""What a module is for, and what precision the model itself declares for it.

Two sources of precision knowledge beyond the policy's own rules:

* **Roles.** ``role:head`` selects output heads: final projections (a ``Linear`` or a
  convolution) whose output leaves the component or a stage of it: the logits
  projection, a vocoder's last convolution, a decoder's ``final_proj``. A whole
  sub-network that happens to be called ``head`` (Chatterbox's speaker-encoder front end,
  12 convolutions and 12 norms) is not a projection, so it is not one.
* **The model's own declarations.** transformers models list modules to keep in fp32
  (``_keep_in_fp32_modules``: under fp16; ``_keep_in_fp32_modules_strict``: under fp16
  and bf16), diffusers models too (``_keep_in_fp32_modules``), diffusers' layerwise
  casting skips ``_skip_layerwise_casting_patterns`` (those layers keep their weights in
  the compute dtype), and a diffusers VAE with ``config.force_upcast`` is run in fp32
  by its own pipelines whenever it is fp16.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Iterable

from torch import nn

from mixprec.policy.tree import first_weight_owner, is_container

__all__ = ["ROLES", "TORCH_NORMS", "output_heads", "norm_layers", "custom_norm_layers", "Declaration", "declarations", "is_projection", "dtype_sources", "dtype_property_source",
           "fp32_kernel"]

_FRAMEWORKS = ("torch.", "transformers.", "diffusers.", "huggingface_hub.")

#: Roles a rule may select with ``role:<name>``.
ROLES: tuple[str, ...] = ("head", "norm", "custom-norm")

#: torch's norm layers whose CPU and CUDA kernels accumulate 16-bit inputs in fp32 (the
#: mean and variance never exist in 16 bits): keeping them in fp32 buys no precision.
#: ``RMSNorm`` is not among them: before torch 2.6 it squares its input in its own dtype.
TORCH_NORMS: tuple[type[nn.Module], ...] = (
    nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm,
    nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d,
)

_PROJECTIONS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
# Last name segments that denote an output stage's final projection across model families
# (LLM heads, vocoders' conv_post, VAEs' and UNets' conv_out / proj_out, flow decoders'
# final_proj, an encoder's projection into the decoder's space).
_HEAD_NAMES = re.compile(
    r"^(?:lm_head|head|\w+_head|conv_out|conv_post|proj_out|final_\w+|\w*encoder_proj|output_proj\w*|to_logits|logits\w*)$"
)


def is_projection(module: nn.Module) -> bool:
    """A ``Linear`` or convolution: the layer type an output head is made of."""
    return isinstance(module, _PROJECTIONS)


def output_heads(components: dict[str, nn.Module]) -> set[int]:
    """``id`` of every module with the ``head`` role.

    A module is a head if it is a projection at a component's output stage and either
    its name says it is a final projection (``lm_head``, ``conv_post``, ``final_proj``,
    ...) or it is the last projection of its component in definition order (what feeds
    the component's output, such as a voice encoder's ``proj`` after its LSTM). A
    projection inside a repeated block (anything held in a ``ModuleList`` or
    ``ModuleDict``: the ``proj_out`` of each transformer block of a UNet, of each stage
    of a DC-AE) is internal, whatever its name.
    """
    heads: set[int] = set()
    for root in components.values():
        last: nn.Module | None = None
        repeated: set[int] = set()
        for name, module in root.named_modules():
            if is_container(module) or id(module) in repeated:
                repeated.update(id(m) for m in module.children())
            if not is_projection(module):
                continue
            last = module
            if id(module) not in repeated and _HEAD_NAMES.match(name.rpartition(".")[2] or name):
                heads.add(id(module))
        if last is not None and last is not root:
            heads.add(id(last))
    return heads


def custom_norm_layers(components: dict[str, nn.Module]) -> set[int]:
    """``id`` of every module with the ``custom-norm`` role: a norm layer (see
    :func:`norm_layers`) that is not one of :data:`TORCH_NORMS` (an RMSNorm of the
    model's own code, which may square its input in its own dtype)."""
    modules = {id(m): m for root in components.values() for m in root.modules()}
    return {key for key in norm_layers(components) if type(modules[key]) not in TORCH_NORMS}


def norm_layers(components: dict[str, nn.Module]) -> set[int]:
    """``id`` of every module with the ``norm`` role: a normalisation layer itself.

    A class named ``*Norm*`` (or derived from one) counts unless it owns a projection:
    diffusers' ``AdaLayerNormZero`` and its kin hold a large modulation ``Linear``
    beside their ``LayerNorm``, and that projection is not normalisation (on a DiT,
    pinning the whole adaptive norm kept about 40% of the weights in fp32). Their inner
    ``LayerNorm`` has the role.
    """
    found: set[int] = set()
    for root in components.values():
        for module in root.modules():
            if any(fnmatch.fnmatchcase(cls.__name__, "*Norm*") for cls in type(module).__mro__) and \
                    not any(is_projection(m) for m in module.modules()):
                found.add(id(module))
    return found


@dataclass(frozen=True)
class Declaration:
    """Modules a model declares should not be stored in some 16-bit types.

    Attributes:
        owner: qualified name of the declaring model (``""`` for a bare model).
        patterns: name fragments (transformers, diffusers) or regexes (layerwise casting).
        regex: whether ``patterns`` are regular expressions.
        storages: the storage dtypes under which the declaration applies.
        when_compute_fp32: apply only when the module computes in fp32 from 16-bit weights.
        source: what declared it, for ``explain``.
    """

    owner: str
    patterns: tuple[str, ...]
    regex: bool
    storages: tuple[str, ...]
    source: str
    when_compute_fp32: bool = False

    def matches(self, relative: str) -> bool:
        """Whether the module at ``relative`` (name inside the declaring model) is covered."""
        if self.patterns == ("",):
            return True  # the whole declaring model
        if self.regex:
            return any(re.search(p, relative) for p in self.patterns)
        parts = relative.split(".")
        return any(p and (p in parts or relative == p or relative.endswith("." + p) or relative.startswith(p + "."))
                   for p in self.patterns)


def _names(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Iterable):
        return tuple(str(v) for v in value if isinstance(v, str))
    return ()


def declarations(components: dict[str, nn.Module]) -> list[Declaration]:
    """Every precision declaration made by the models inside ``components``."""
    found: list[Declaration] = []
    for cname, root in components.items():
        for name, module in root.named_modules():
            owner = f"{cname}.{name}" if cname and name else (cname or name)
            cls = type(module).__name__
            keep = _names(getattr(module, "_keep_in_fp32_modules", None) or ())
            if keep:
                found.append(Declaration(owner, keep, False, ("fp16",), f"{cls}._keep_in_fp32_modules"))
            strict = _names(getattr(module, "_keep_in_fp32_modules_strict", None) or ())
            if strict:
                found.append(Declaration(owner, strict, False, ("fp16", "bf16"), f"{cls}._keep_in_fp32_modules_strict"))
            skip = _names(getattr(module, "_skip_layerwise_casting_patterns", None) or ())
            if skip:
                found.append(Declaration(owner, skip, True, ("fp16", "bf16"), f"{cls}._skip_layerwise_casting_patterns",
                                         when_compute_fp32=True))
            config = getattr(module, "config", None)
            if getattr(config, "force_upcast", False) is True:
                found.append(Declaration(owner, ("",), False, ("fp16",), f"{cls}.config.force_upcast"))
    return found


def _own_dtype_property(module: nn.Module) -> tuple[str, property] | None:
    """``(class name, property)`` of a ``dtype`` property the model's own code defines."""
    for cls in type(module).__mro__:
        if cls is object or cls.__module__.startswith(_FRAMEWORKS):
            continue
        prop = vars(cls).get("dtype")
        if isinstance(prop, property) and prop.fget is not None and hasattr(prop.fget, "__code__"):
            return cls.__name__, prop
    return None


def dtype_property_source(module: nn.Module) -> tuple[str, nn.Module] | None:
    """``(class name, module whose weights it reads)`` for a model's own ``dtype`` property."""
    found = _own_dtype_property(module)
    if found is None:
        return None
    cls_name, prop = found
    read = [module._modules[n] for n in prop.fget.__code__.co_names if n in module._modules and module._modules[n] is not None]
    owner = first_weight_owner(read[0]) if read else first_weight_owner(module)
    return (cls_name, owner) if owner is not None else None


def dtype_sources(components: dict[str, nn.Module]) -> dict[int, str]:
    """Modules whose weights a model's own ``dtype`` property reads, by ``id``, with why.

    App code defines ``dtype`` as ``next(self.flow.parameters()).dtype`` (Chatterbox's
    S3Gen) or ``self.final_proj.weight.dtype`` (its flow decoder) and casts its inputs
    to it, token ids included: with that module stored in 16 bits, ids above 256 (bf16)
    or 2048 (fp16) are silently rounded. The property's code names the child it reads;
    this finds that child's first weight-owning module.
    """
    sources: dict[int, str] = {}
    for cname, root in components.items():
        for name, module in root.named_modules():
            found = dtype_property_source(module)
            if found is not None:
                qualname = f"{cname}.{name}" if cname and name else (cname or name)
                sources.setdefault(id(found[1]), f"{found[0]}.dtype of {qualname or 'the model'} reads its weights "
                                                 "(the model casts its inputs, token ids included, to that dtype)")
    return sources


#: Where torch's quantized layers live (``torch.ao.quantization.quantize_dynamic`` / ``convert``).
_QUANTIZED_PACKAGES = ("torch.ao.nn.quantized", "torch.ao.nn.intrinsic.quantized", "torch.nn.quantized")


def fp32_kernel(module: nn.Module) -> str | None:
    """Why ``module`` computes from fp32 activations whatever a policy says, or ``None``.

    torch's quantized layers hold their weights packed in int8 (no floating parameter to
    cast) and run kernels that take fp32 activations only: a dynamic one quantizes its
    fp32 input itself, a static one takes a tensor quantized from fp32. A 16-bit input
    fails ("expected scalar type Float"); such a layer computes in fp32 beside float
    layers computing in 16 bits.
    """
    kind = type(module).__module__
    if kind.startswith(_QUANTIZED_PACKAGES):
        return f"{type(module).__name__} is a torch quantized layer: its int8 kernel takes fp32 activations"
    return None
