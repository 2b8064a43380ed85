"""What :func:`~mixprec.casting.apply.apply` works on: a module, a mapping of named modules
or a pipeline, normalised to named components, and their weight bytes; the torch dtype each
policy dtype name stands for; and :class:`ApplyError` for a target or option it refuses.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from mixprec.casting.fp8 import FP8_DTYPES, scale_bytes
from mixprec.casting.kinds import castable, is_lazy, refusal, refusal_of_context, stored_bytes, unusable

__all__ = ["ApplyError", "DTYPES", "components_of", "refuse_meta", "refuse_unsupported", "weight_bytes"]

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, **FP8_DTYPES}


class ApplyError(ValueError):
    """The target or the options of ``apply`` are invalid; nothing was changed."""


def components_of(target: Any) -> tuple[dict[str, nn.Module], tuple[str, ...]]:
    """Normalise a target to (named components, sensitive hints).

    A bare ``nn.Module`` is one component named ``""`` (module names stay unprefixed);
    a mapping gives its items; a pipeline gives ``pipeline.components`` and its
    ``sensitive`` hints.
    """
    if isinstance(target, nn.Module):
        return {"": target}, ()
    if isinstance(target, Mapping):
        comps = dict(target)
        hints: tuple[str, ...] = ()
        for name, module in comps.items():
            if not isinstance(module, nn.Module):
                raise ApplyError(f"component {name!r} is a {type(module).__name__}, not an nn.Module")
        return comps, hints
    source = getattr(target, "components", None)
    if not isinstance(source, Mapping):
        raise ApplyError(f"cannot apply a policy to {type(target).__name__}: pass an nn.Module, a mapping of named modules, or a pipeline")
    # A pipeline (ours, or a diffusers DiffusionPipeline): its modules are the components;
    # tokenizers, schedulers and absent parts (None) are not models and are left alone.
    comps = {name: module for name, module in source.items() if isinstance(module, nn.Module)}
    if not comps:
        raise ApplyError(f"{type(target).__name__} has no nn.Module components (found: "
                         f"{', '.join(f'{k}={type(v).__name__}' for k, v in source.items()) or 'none'})")
    return comps, tuple(getattr(target, "sensitive", ()) or ())


def refuse_context(function: str) -> None:
    """Refuse, before anything changes, a call of ``function`` made where mixprec cannot work: inside a
    ``torch.func`` transform, under torch's fake, functional or proxy dispatch mode, inside a trace
    (:func:`~mixprec.casting.kinds.refusal_of_context`). The one check ``apply``, ``revert``, ``reapply``,
    ``profile``, ``guard`` and ``calibrate`` share.

    Raises:
        ApplyError: naming the function, the context and what to do.
    """
    context = refusal_of_context()
    if context is not None:
        raise ApplyError(f"{function} was called {context}; nothing was changed. Call it outside, before the "
                         "transform or mode is entered (an applied model then runs inside it)")


def refuse_tensors(comps: Mapping[str, nn.Module]) -> None:
    """Refuse components holding floating tensors a policy cannot compute from: meta and fake ones (no
    values), mkldnn ones, functorch-wrapped ones (:func:`refuse_meta`, over every floating tensor)."""
    refuse_meta([(f"{cname}.{name}" if cname else name, t) for cname, root in comps.items()
                 for name, t in [*root.named_parameters(), *root.named_buffers()] if t.is_floating_point()])


def refuse_unsupported(comps: Mapping[str, nn.Module]) -> None:
    """Refuse, before anything changes, components whose weights a policy cannot cast.

    Raises:
        ApplyError: when called inside a ``torch.func`` transform or under torch's fake,
            functional or tracing dispatch mode; for a TorchScript module (``torch.jit.script``/
            ``trace``: no Python forward to wrap, its tensors are the compiled graph's), a lazy
            module's parameter that has no shape yet (``nn.LazyLinear`` before its first
            forward), or a tensor no step can read (:func:`~mixprec.casting.kinds.unusable`).
    """
    refuse_context("mixprec.apply")
    for cname, root in comps.items():
        label = repr(cname) if cname else "(root)"
        named = [*root.named_parameters(), *root.named_buffers()]
        lazy = [name for name, t in named if is_lazy(t)]
        if lazy:
            raise ApplyError(f"component {label} has {len(lazy)} uninitialised lazy parameter(s) or buffer(s) (first: "
                             f"{lazy[0]!r}, of a lazy module such as nn.LazyLinear): they have no shape or values to cast "
                             "yet; nothing was changed. Run one forward of the model first (it initialises them), then apply")
        for name, t in named:
            why = unusable(t)
            if why is not None:
                raise ApplyError(f"component {label}: tensor {name!r} is {why}; nothing was changed")
        scripted = next((name for name, m in root.named_modules() if isinstance(m, torch.jit.ScriptModule)), None)
        if scripted is not None:
            where = f" (submodule {scripted!r})" if scripted else ""
            raise ApplyError(f"component {label} is a TorchScript module{where}: mixprec cannot cast its weights or wrap "
                             "its forward; nothing was changed. Apply the policy to the eager nn.Module, before "
                             "torch.jit.script / torch.jit.trace")


#: What each reason :func:`~mixprec.casting.kinds.refusal` gives means for a cast, and what to do about it.
_REMEDIES = {
    "on the meta device": ("they hold no values", "Load the weights first (for example model.to_empty(device='cpu') then "
                           "model.load_state_dict(...), or load without device_map='meta' / init_empty_weights), then apply"),
    "a fake tensor (FakeTensorMode)": ("they hold no values", "Apply the policy to the model with real weights, before "
                                       "FakeTensorMode converts it"),
}
_MKLDNN = ("they cannot be cast", "Convert them to plain dense tensors first (t.to_dense()), or keep their modules in "
           "fp32 with a rule such as Rule('<module name>', storage='fp32')")


def refuse_meta(cast: list[tuple[str, torch.Tensor]]) -> None:
    """Refuse ``(qualified name, tensor)`` pairs a policy would cast that cannot be cast in place:
    meta and fake tensors (no values), mkldnn tensors, functorch-wrapped ones
    (:func:`~mixprec.casting.kinds.refusal`). Tensors a policy leaves (:func:`~mixprec.casting.kinds.castable`)
    are never refused.

    Raises:
        ApplyError: naming the first tensor of the first kind found, the kind and what to do.
    """
    refused = [(name, why) for name, t in cast if castable(t) and (why := refusal(t)) is not None]
    if not refused:
        return
    why = refused[0][1]
    names = [name for name, reason in refused if reason == why]
    what, remedy = _REMEDIES.get(why) or (_MKLDNN if "mkldnn" in why else ("they cannot be cast", ""))
    if why == "on the meta device":
        raise ApplyError(f"{len(names)} tensor(s) the policy would cast are on the meta device (first: {names[0]!r}) and "
                         f"hold no values; nothing was changed. {remedy}")
    raise ApplyError(f"{len(names)} tensor(s) the policy would cast are {why} (first: {names[0]!r}): {what}; nothing was "
                     f"changed. {remedy}".rstrip())


def weight_bytes(target: Any) -> int:
    """Bytes of all unique parameters and buffers of a target, as each kind stores them
    (a sparse tensor's indices and values, nothing for a meta tensor: :mod:`mixprec.casting.kinds`),
    the scales of fp8-stored weights, and the tensors offload hooks keep for them (:mod:`mixprec.casting.offload`)."""
    from mixprec.casting.offload import offloaded_bytes

    comps, _ = components_of(target)
    seen: set[int] = set()
    total = 0
    for root in comps.values():
        for t in list(root.parameters()) + list(root.buffers()):
            if id(t) not in seen:
                seen.add(id(t))
                total += stored_bytes(t) + scale_bytes((t,))
    return total + offloaded_bytes(m for root in comps.values() for m in root.modules())
