"""Name -> factory registry of pipelines, extensible through entry points.

Built-in pipelines are registered by module path and imported only when built.
Third-party packages add pipelines through the ``mixprec.pipelines``
entry-point group; each entry point's value is a factory callable accepting
``size=`` and ``seed=`` keywords and returning a :class:`Pipeline`::

    [project.entry-points."mixprec.pipelines"]
    my-tts = "my_package.pipelines:build_my_tts"

Entry points are discovered and loaded on first use of the registry (not on
import).  A plugin that fails to load is reported with :func:`warnings.warn`
and in :func:`plugin_errors`; the other pipelines stay available.

Besides registered names, :func:`get` accepts a *factory spec*: your own code,
named without registering it::

    pipelines.get("my_package.pipelines:build_my_tts")     # module path : attribute
    pipelines.get("examples/chatterbox_tts.py:pipeline")   # .py file : attribute

A name containing ``:`` is always a factory spec (registered names cannot
contain one); :mod:`mixprec.pipelines._factory` loads and builds them.
"""

from __future__ import annotations

import difflib
import importlib
import sys
import warnings
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

import torch

from mixprec._quote import quote
from mixprec.pipelines._base import Pipeline, check_batch_seed
from mixprec.pipelines._factory import accepted_keywords, build_factory, is_factory_spec

__all__ = [
    "BUILD_EVENT",
    "ENTRY_POINT_GROUP",
    "PluginWarning",
    "UnknownPipelineError",
    "available",
    "builtin_names",
    "get",
    "plugin_errors",
    "register",
]

#: Entry-point group scanned for third-party pipelines.
ENTRY_POINT_GROUP = "mixprec.pipelines"

#: The audit event (:func:`sys.audit`) :func:`get` raises before it builds a pipeline, with its
#: name and size: ``sys.addaudithook`` sees every build, in a process and in its workers.
BUILD_EVENT = "mixprec.pipelines.build"

Factory = Callable[..., Pipeline]

_BUILTINS: dict[str, str] = {
    "tts": "mixprec.pipelines.tts:build",
    "diffusion": "mixprec.pipelines.diffusion:build",
    "minilm": "mixprec.pipelines.minilm:build",
}

_registered: dict[str, Factory] = {}
_plugins: dict[str, Factory] | None = None
_errors: dict[str, str] = {}


class UnknownPipelineError(ValueError):
    """Raised by :func:`get` for a name no pipeline is registered under."""


class PluginWarning(UserWarning):
    """Warned when an entry-point pipeline plugin cannot be loaded."""



def register(name: str, factory: Factory, *, replace: bool = False) -> None:
    """Register ``factory`` under ``name``.

    Args:
        name: Registry name (non-empty, no whitespace).
        factory: Callable accepting ``size=``, ``seed=`` (and optional extra
            keywords) that returns a :class:`Pipeline`.
        replace: Allow replacing an existing registration (built-ins included).

    Raises:
        ValueError: For an invalid name, a non-callable factory, or a name in
            use while ``replace`` is false.
    """
    if not isinstance(name, str) or not name or name != name.strip() or " " in name:
        raise ValueError(f"pipeline name must be a non-empty string without spaces, got {quote(name)}")
    if ":" in name:
        raise ValueError(
            f"pipeline name {quote(name)} contains ':', which marks a factory spec "
            "(module:factory or file.py:factory); choose a name without ':'"
        )
    if not callable(factory):
        raise ValueError(f"factory for {name!r} must be callable, got {factory!r}")
    if not replace and (name in _registered or name in _BUILTINS):
        raise ValueError(f"pipeline {name!r} is already registered (pass replace=True)")
    _registered[name] = factory


def _load_plugins() -> dict[str, Factory]:
    """Discover and load entry points once; remember failures by name."""
    global _plugins
    if _plugins is not None:
        return _plugins
    loaded: dict[str, Factory] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        problem = None
        if ep.name in _BUILTINS or ep.name in _registered or ep.name in loaded:
            problem = f"name {ep.name!r} is already taken; entry point {ep.value!r} ignored"
        elif ":" in ep.name:
            problem = f"name {ep.name!r} contains ':', which marks a factory spec; entry point ignored"
        else:
            try:
                factory = ep.load()
            except Exception as exc:  # a plugin may fail in any way while importing
                problem = f"cannot load {ep.value!r}: {type(exc).__name__}: {exc}"
            else:
                if callable(factory):
                    loaded[ep.name] = factory
                else:
                    problem = f"{ep.value!r} is not callable"
        if problem is not None:
            _errors[ep.name] = problem
            warnings.warn(
                f"mixprec pipeline plugin {ep.name!r}: {problem}", PluginWarning, stacklevel=3
            )
    _plugins = loaded
    return loaded


def _reset() -> None:
    """Forget discovered entry points, their errors and explicit registrations."""
    global _plugins
    _plugins = None
    _errors.clear()
    _registered.clear()


def refresh() -> None:
    """Re-discover entry points (e.g. after installing a plugin in a running process)."""
    global _plugins
    _plugins = None
    _errors.clear()
    _load_plugins()


def plugin_errors() -> dict[str, str]:
    """Return ``{entry point name: reason}`` for plugins that failed to load."""
    _load_plugins()
    return dict(_errors)


def builtin_names() -> list[str]:
    """The names of the pipelines mixprec ships, without loading any plugin."""
    return list(_BUILTINS)


def available() -> list[str]:
    """Return the sorted names of every usable pipeline (built-in, registered, plugin)."""
    return sorted({*_BUILTINS, *_registered, *_load_plugins()})


def _lookup(name: str) -> Factory:
    if name in _registered:
        return _registered[name]
    if name in _BUILTINS:
        module_name, attr = _BUILTINS[name].split(":")
        return getattr(importlib.import_module(module_name), attr)
    plugins = _load_plugins()
    if name in plugins:
        return plugins[name]
    names = available()
    if name in _errors:
        raise UnknownPipelineError(
            f"pipeline {quote(name)} comes from a plugin that failed to load ({_errors[name]}); "
            f"available pipelines: {', '.join(names)}"
        )
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.5) if len(str(name)) <= 200 else []
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownPipelineError(
        f"unknown pipeline {quote(name)}; available pipelines: {', '.join(names)}.{hint}"
    )


def get(name: str, *, size: str = "default", seed: int = 0, device: str | Any | None = None, **kwargs: Any) -> Pipeline:
    """Build the pipeline registered under ``name``, or the one a factory spec names.

    Every call raises the audit event :data:`BUILD_EVENT` (``name``, ``size``) first.

    Args:
        name: A name from :func:`available`, or a factory spec
            ``"module.path:factory"`` / ``"path/to/file.py:factory"`` (see
            :func:`build_factory` for how the factory is called).  A name
            containing ``:`` is always treated as a spec, never looked up.
        size: ``"default"`` (benchmark size) or ``"test"`` (tiny), or another
            size the pipeline defines.
        seed: Seed of the weight initialisation.
        device: Device of the components (``None``: the factory's own default).
            A factory that accepts ``device`` (or ``**kwargs``) gets it; one that
            does not is built without it and moved with :meth:`Pipeline.to`, as
            :func:`build_factory` does for a factory spec.
        **kwargs: Passed to the factory (e.g. size overrides).

    Raises:
        UnknownPipelineError: If ``name`` is not registered (a ``ValueError``).
        FactoryError: If a factory spec cannot give a pipeline (a ``ValueError``).
        ValueError: For an invalid ``seed`` or options rejected by the factory.
        TypeError: If a registered factory does not return a :class:`Pipeline`.
    """
    check_batch_seed(1, seed)
    # An audit event (PEP 578) for whoever watches what a process costs: a test harness counts builds.
    sys.audit(BUILD_EVENT, name, size)
    if is_factory_spec(name):
        return build_factory(name, size=size, seed=seed, device=device, **kwargs)
    factory = _lookup(name)
    passed = device is not None and _takes_device(factory)
    pipeline = factory(size=size, seed=seed, **({"device": device} if passed else {}), **kwargs)
    if not isinstance(pipeline, Pipeline):
        raise TypeError(
            f"factory of pipeline {name!r} returned {type(pipeline).__name__}, not a Pipeline"
        )
    if device is not None and not passed and pipeline.device != torch.device(device):
        pipeline.to(device)
    return pipeline


def _takes_device(factory: Factory) -> bool:
    """Whether ``factory`` accepts ``device=`` (a named parameter or ``**kwargs``; one that cannot be inspected is given it)."""
    accepted = accepted_keywords(factory)
    if accepted is None:
        return True
    named, var_kw = accepted
    return "device" in named or var_kw
