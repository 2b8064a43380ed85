"""The name a transformers model gives its key/value cache, in the version installed.

transformers 5.24 renamed ``past_key_values`` to ``cache``, in a model's ``forward``
arguments and in its outputs; the old name still works there, with a deprecation warning
on every run (removed in 5.40). Code that hands a decoder its cache (the ``tts``
reference pipeline, the static cache of a compiled decode) asks these functions for the
name the model takes, so it passes the current form where one exists and still runs on
the transformers versions before it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

__all__ = ["CACHE_NAMES", "cache_keyword", "cache_of", "current_names", "output_cache"]

#: The names a cache goes by, newest first.
CACHE_NAMES = ("cache", "past_key_values")


def cache_keyword(model: Any) -> str:
    """The keyword ``model``'s ``forward`` takes its key/value cache by: ``"cache"`` where it
    takes that (transformers 5.24 and later), else ``"past_key_values"``."""
    forward = getattr(type(model), "forward", None)
    try:
        parameters = inspect.signature(forward).parameters if forward is not None else {}
    except (TypeError, ValueError):
        parameters = {}
    return CACHE_NAMES[0] if CACHE_NAMES[0] in parameters else CACHE_NAMES[1]


@functools.lru_cache(maxsize=1024)
def _renames_cache(function: Any) -> bool:
    """Whether ``function`` takes ``cache`` and no longer names ``past_key_values`` (its deprecation
    shim, such as transformers' ``deprecate_kwarg``, reads the old name and warns)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return CACHE_NAMES[0] in parameters and CACHE_NAMES[1] not in parameters


def current_names(method: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for a call of ``method`` that mixprec makes on the app's behalf (a hook's call of
    the method it wraps): the cache the app passed as ``past_key_values`` passed as ``cache``
    where ``method`` takes that name. transformers renames it the same way, with a deprecation
    warning that names its caller: called from mixprec's frame, the warning would blame mixprec
    for the app's spelling. Anything else is passed as given."""
    if CACHE_NAMES[1] not in kwargs or CACHE_NAMES[0] in kwargs:
        return kwargs
    try:
        renames = _renames_cache(getattr(method, "__func__", method))
    except TypeError:  # an unhashable callable
        return kwargs
    if not renames:
        return kwargs
    renamed = {name: value for name, value in kwargs.items() if name != CACHE_NAMES[1]}
    renamed[CACHE_NAMES[0]] = kwargs[CACHE_NAMES[1]]
    return renamed


def cache_of(kwargs: dict[str, Any]) -> tuple[str | None, Any]:
    """The keyword a call's ``kwargs`` hand a cache by, and that cache (``(None, None)`` without one)."""
    for name in CACHE_NAMES:
        if kwargs.get(name) is not None:
            return name, kwargs[name]
    return None, None


def output_cache(output: Any) -> Any:
    """The cache a model's output returns, read by the field its class declares (``cache`` in
    transformers 5.24 and later, ``past_key_values`` before), so no deprecated name is read."""
    fields = {f.name for f in dataclasses.fields(output)} if dataclasses.is_dataclass(output) else set()
    for name in CACHE_NAMES:
        if name in fields:
            return getattr(output, name)
    return getattr(output, CACHE_NAMES[1], None)
