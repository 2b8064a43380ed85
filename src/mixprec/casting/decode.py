"""Token-by-token decoding in a compiled component: a static key/value cache, one compiled step for every position.

A decoder called once per token with transformers' default cache hands the compiled
code a cache that grows by one position per call: new shapes and strides every step,
so Dynamo recompiles until its recompile limit and then runs the rest eagerly. The
anchors (transformers' ``generate`` with ``cache_implementation="static"``, gpt-fast)
decode with a pre-allocated cache instead: every step has the same shapes and the
position is a tensor, so one compiled step serves every position, and on a GPU it can
be captured as a CUDA graph (compile mode ``reduce-overhead``).

:class:`StaticDecode` does that for a compiled transformers decoder:

* ``generate()`` uses a static cache (``generation_config.cache_implementation``); revert
  puts the model's own setting back.
* A direct call with ``use_cache=True`` and no cache (the prefill of an app's own decoding
  loop, as Chatterbox's T3 and the ``tts`` pipeline run it) gets a
  ``transformers.StaticCache`` and runs eagerly, as ``generate`` runs its prefill; the
  cache it returns is the one the app hands back on every later step, and those steps run
  compiled. The cache starts at the prompt plus :data:`HEADROOM` positions (never beyond
  ``max_position_embeddings``) and doubles in place when a step would pass its end: one
  recompile per doubling, not one per token.

Anything else (no ``use_cache``, a cache the app made itself, transformers before 5)
passes through unchanged.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from mixprec._kv_cache import CACHE_NAMES, cache_keyword, cache_of

__all__ = ["StaticDecode", "HEADROOM"]

#: Positions a new static cache holds beyond its prompt before it first doubles.
HEADROOM = 256


def _static_cache_class() -> Any:
    try:
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer
    except ImportError:  # transformers missing, or before 5 (no lazily allocated layers)
        return None
    return StaticCache if hasattr(StaticLayer, "lazy_initialization") else None


class StaticDecode:
    """Static key/value caches for one compiled transformers decoder (see the module docstring)."""

    def __init__(self, root: nn.Module) -> None:
        self.root = root
        self.cache_class = _static_cache_class()
        config = getattr(root, "config", None)
        self.limit = int(getattr(config, "max_position_embeddings", 0) or 0)
        self._generation = getattr(root, "generation_config", None)
        self._previous = getattr(self._generation, "cache_implementation", None)
        if self._generation is not None and self._previous is None:
            self._generation.cache_implementation = "static"

    @staticmethod
    def applies(root: nn.Module) -> bool:
        """Whether ``root`` is a transformers model that decodes with a cache and compiles whole."""
        return (_static_cache_class() is not None and getattr(root, "_can_compile_fullgraph", False)
                and callable(getattr(root, "can_generate", None)) and root.can_generate()
                and hasattr(getattr(root, "config", None), "num_hidden_layers"))

    def remove(self) -> None:
        if self._generation is not None and self._previous is None and self._generation.cache_implementation == "static":
            self._generation.cache_implementation = None

    def call(self, compiled: Callable[..., Any], eager: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        _, cache = cache_of(kwargs)
        if self.cache_class is None:
            return compiled(*args, **kwargs)
        if cache is None and kwargs.get("use_cache") is True:
            length = self._length(args, kwargs)
            if length is not None:
                start = length + HEADROOM
                cache = self.cache_class(config=self.root.config, max_cache_len=min(start, self.limit) if self.limit else start)
                passed = {name: value for name, value in kwargs.items() if name not in CACHE_NAMES}
                return eager(*args, **passed, **{cache_keyword(self.root): cache})
        if isinstance(cache, self.cache_class):
            length = self._length(args, kwargs)
            if length is not None:
                self._make_room(cache, length)
        return compiled(*args, **kwargs)

    @staticmethod
    def _length(args: tuple, kwargs: dict) -> int | None:
        """How many positions the call adds: the length of its ids or embeddings."""
        for value in (args[0] if args else None, kwargs.get("input_ids"), kwargs.get("inputs_embeds")):
            if isinstance(value, torch.Tensor) and value.dim() >= 2:
                return int(value.shape[1])
        return None

    def _make_room(self, cache: Any, adding: int) -> None:
        """Double the cache's capacity in place (its tensors copied) while ``adding`` more would not fit."""
        layers = [layer for layer in getattr(cache, "layers", ()) if getattr(layer, "is_initialized", False)
                  and hasattr(layer, "cumulative_length") and not getattr(layer, "is_sliding", False)]
        if not layers:
            return
        used = int(layers[0].cumulative_length)
        capacity = layers[0].max_cache_len
        if used + adding <= capacity:
            return
        new = capacity
        while used + adding > new:
            new *= 2
        if self.limit:
            new = max(min(new, self.limit), used + adding)
        for layer in layers:
            for name in ("keys", "values"):
                old = getattr(layer, name)
                grown = old.new_zeros((*old.shape[:2], new, *old.shape[3:]))
                grown[:, :, : old.shape[2]] = old
                torch._dynamo.mark_static_address(grown)
                setattr(layer, name, grown)
            layer.max_cache_len = new
        if hasattr(cache, "max_cache_len"):
            try:
                cache.max_cache_len = new
            except AttributeError:
                pass  # a read-only property computed from the layers
