"""Reading a model's module tree: which children are called, which methods an app
calls, which module ``self.dtype`` reads. Pure inspection: nothing here changes a
module, so policies, casting and diagnosis all build on it.
"""

from __future__ import annotations

import inspect
from typing import Iterator

from torch import nn

__all__ = ["entry_methods", "is_torch_layer", "is_container", "called_children", "first_weight_owner", "token_decoder"]

#: Parameters of a ``forward`` that carries a key/value cache from one decode step to the next.
_CACHE_PARAMETERS = ("cache", "past_key_values", "past_key_value", "use_cache", "kv_cache", "layer_past", "cache_position")


_FRAMEWORK_MODULES = ("torch.", "transformers.modeling_utils", "transformers.generation", "transformers.integrations",
                      "diffusers.models.modeling_utils", "diffusers.configuration_utils", "huggingface_hub.")


def entry_methods(module: nn.Module) -> list[str]:
    """Public methods an app may call on a component: ``forward`` and the model's own.

    Methods inherited from torch and from the frameworks' base classes (``to``,
    ``save_pretrained``, ``generate``, which calls ``forward``) are left out;
    properties, static and class methods too.
    """
    names = ["forward"]
    for cls in type(module).__mro__:
        if cls is object or cls.__module__.startswith(_FRAMEWORK_MODULES):
            continue
        for name, value in vars(cls).items():
            if name.startswith("_") or name in names or not inspect.isfunction(value):
                continue
            names.append(name)
    return names


def is_torch_layer(module: nn.Module) -> bool:
    """Whether ``module`` is one of torch's own layers (``nn.Linear``, ``nn.Conv1d``, ...)."""
    return type(module).__module__.startswith("torch.nn.")


def is_container(module: nn.Module) -> bool:
    """``ModuleList`` / ``ModuleDict`` / parameter containers: held, never called."""
    return isinstance(module, (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict))


def called_children(module: nn.Module) -> Iterator[nn.Module]:
    """Direct children that are called, looking through ModuleList / ModuleDict."""
    for child in module.children():
        if is_container(child):
            yield from called_children(child)
        else:
            yield child


def first_weight_owner(module: nn.Module) -> nn.Module | None:
    """The module owning ``next(module.parameters())`` among floating ones: what ``self.dtype`` code reads."""
    for name, param in module.named_parameters():
        if param.is_floating_point():
            return module.get_submodule(name.rpartition(".")[0]) if "." in name else module
    return None


def token_decoder(module: nn.Module) -> nn.Module | None:
    """The first module in ``module``'s tree whose ``forward`` takes a key/value cache
    (``cache``, ``past_key_values``, ``use_cache``, ...): a model that decodes token by token, whose
    steps on a GPU are launch-bound (many small kernels per token). ``None`` where none does."""
    for sub in module.modules():
        try:
            params = inspect.signature(type(sub).forward).parameters
        except (TypeError, ValueError):
            continue
        if any(name in params for name in _CACHE_PARAMETERS):
            return sub
    return None
