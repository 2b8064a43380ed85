"""The public functions' arguments, checked at the door.

Every function :mod:`mixprec` (and :mod:`mixprec.gradio`) exports is wrapped once by
:func:`checked`: before the function runs, each argument is compared with its parameter's
annotation. A value of the wrong kind, or ``None`` where an object is needed, is refused
with a :class:`TypeError` in mixprec's words, naming the function, the parameter, what was
given and what is accepted, before anything changes. A preset's name is accepted wherever
a :class:`~mixprec.policy.Policy` is: it is resolved for the target's device, as
:func:`mixprec.apply` resolves it. A parameter named ``target`` (a model, a mapping of named
modules, or a pipeline) is checked as :func:`mixprec.apply` reads one.

The annotations are the single source: a function added to the public surface is checked
by being wrapped, and tests read the same signatures.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import os
import types
import typing
from typing import Any, Callable

from mixprec._quote import clip

__all__ = ["checked", "check_exports", "accepts", "describe", "ArgumentError"]


class ArgumentError(TypeError):
    """A public function was given a value of the wrong kind (a :class:`TypeError`)."""


def _target_error(message: str) -> TypeError:
    """A target of the wrong kind: an :class:`ArgumentError` that is also an :class:`~mixprec.ApplyError`, as a
    bad target always was (code catching ``ApplyError`` keeps working)."""
    from mixprec.casting.targets import ApplyError

    class TargetError(ArgumentError, ApplyError):
        pass

    TargetError.__name__ = TargetError.__qualname__ = "ArgumentError"
    return TargetError(message)


_ARTICLES = {"int": "an int", "float": "a number", "str": "a str", "Applied": "an Applied (what mixprec.apply returns)", "object": "an object"}
#: Parameters holding a model: checked as mixprec.apply reads a target.
_TARGETS = ("target",)


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """The parameters' annotations, resolved; one that cannot be resolved is left unchecked."""
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - a name only imported for type checkers: resolve the others one by one
        found = {}
        for name, text in getattr(fn, "__annotations__", {}).items():
            try:
                found[name] = eval(text, fn.__globals__) if isinstance(text, str) else text  # noqa: S307 - the module's own annotation
            except Exception:  # noqa: BLE001 - unresolvable: unchecked
                continue
        return found


def _is_policy(annotation: Any) -> bool:
    from mixprec.policy import Policy

    return annotation is Policy or Policy in typing.get_args(annotation)


def accepts(value: Any, annotation: Any) -> bool:
    """Whether ``value`` is of a kind ``annotation`` allows (containers: their items too, shallowly)."""
    if annotation is Any or annotation is object or isinstance(annotation, typing.TypeVar):
        return True
    if annotation is None or annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(accepts(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if origin is collections.abc.Callable or annotation is collections.abc.Callable:
        return callable(value)
    if origin in (type, typing.Type):
        return isinstance(value, type)
    if origin is not None:
        if not isinstance(origin, type) or not isinstance(value, origin):
            return False
        if isinstance(value, (str, bytes)) and origin is not str and issubclass(origin, collections.abc.Sequence):
            return False  # a string is not a sequence of names
        if origin in (tuple,) and args and (len(args) == 2 and args[1] is Ellipsis):
            return all(accepts(v, args[0]) for v in value)
        if origin in (list, set, frozenset, collections.abc.Sequence, collections.abc.Set) and args:
            return all(accepts(v, args[0]) for v in value)
        if origin in (dict, collections.abc.Mapping) and len(args) == 2:
            return all(accepts(k, args[0]) and accepts(v, args[1]) for k, v in value.items())
        return True
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is os.PathLike:
        return isinstance(value, os.PathLike)
    if getattr(annotation, "_is_protocol", False):  # what it must have, as a type checker reads a Protocol
        members = [n for n in vars(annotation) if not n.startswith("_")]
        return all(hasattr(value, n) for n in members)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True  # a form this check does not know: unchecked


def describe(annotation: Any) -> str:
    """What ``annotation`` accepts, in words."""
    if annotation is None or annotation is type(None):
        return "None"
    if annotation is Any:
        return "anything"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if _is_policy(annotation):
            rest = [describe(a) for a in args if a.__name__ != "Policy" and a is not str]
            return " or ".join(["a Policy or a preset's name (quality, balanced, fast, memory)", *rest])
        return " or ".join(dict.fromkeys(describe(a) for a in args))
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in args)
    if origin is collections.abc.Callable or annotation is collections.abc.Callable:
        return "a callable"
    if origin is not None:
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return f"a tuple of {_items(args[0])}"
        if origin in (tuple, list, collections.abc.Sequence) and args:
            return f"a {'list' if origin is list else 'sequence'} of {_items(args[0])}"
        if origin in (dict, collections.abc.Mapping) and len(args) == 2:
            return f"a mapping of {_items(args[0])} to {_items(args[1])}"
        return describe(origin)
    name = getattr(annotation, "__name__", str(annotation))
    if name == "Policy":
        return "a Policy or a preset's name (quality, balanced, fast, memory)"
    if name == "PathLike":
        return "a path"
    return _ARTICLES.get(name, f"a {name}")


def _items(annotation: Any) -> str:
    text = describe(annotation)
    if text == "anything":
        return "values"
    for article in ("a ", "an "):
        if text.startswith(article):
            return text[len(article):] + "s"
    return text


def _given(value: Any) -> str:
    if value is None:
        return "None"
    text = repr(value) if isinstance(value, (str, bytes, int, float, bool)) else ""
    return f"{type(value).__name__} {clip(text, limit=60, escape=True)}".strip()


def _check_target(where: str, name: str, value: Any) -> None:
    from mixprec.casting.targets import ApplyError, components_of

    try:
        components_of(value)
    except (ApplyError, TypeError, ValueError, AttributeError) as exc:
        raise _target_error(f"{where}: {name} must be an nn.Module, a mapping of named modules or a pipeline, not "
                            f"{_given(value)}") from exc


def _preset_for(where: str, arguments: dict[str, Any], value: str) -> Any:
    """A preset's name given where a Policy is: resolved for the target's device, as apply resolves it."""
    from mixprec.calibration.trials import device_of
    from mixprec.casting.targets import components_of
    from mixprec.device.hardware import probe
    from mixprec.policy.presets import preset

    target = next((arguments[t] for t in _TARGETS if t in arguments), None)
    if target is None:
        return preset(value)
    components, hints = components_of(target)
    return preset(value, hardware=probe(device_of(components)), hints=hints)


def checked(fn: Callable[..., Any], where: str | None = None) -> Callable[..., Any]:
    """``fn`` with its arguments checked against its annotations first (see the module docstring)."""
    where = where or f"mixprec.{fn.__name__}"
    signature = inspect.signature(fn)
    hints = _hints(fn)
    hints.pop("return", None)

    def check(args: tuple, kwargs: dict) -> inspect.BoundArguments:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise ArgumentError(f"{where}: {exc}; its parameters: {signature}") from None
        for name, value in list(bound.arguments.items()):
            param = signature.parameters[name]
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            annotation = hints.get(name, Any)
            if name in _TARGETS and annotation is Any:
                _check_target(where, name, value)
                continue
            if isinstance(value, str) and _is_policy(annotation) and not accepts(value, annotation):
                bound.arguments[name] = _preset_for(where, bound.arguments, value)
                continue
            if not accepts(value, annotation):
                raise ArgumentError(f"{where}: {name} must be {describe(annotation)}, not {_given(value)}")
        return bound

    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"{where}: checked() wraps plain functions")

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = check(args, kwargs)
        return fn(*bound.args, **bound.kwargs)

    wrapper.__signature__ = signature  # type: ignore[attr-defined]
    wrapper.__mixprec_checked__ = True  # type: ignore[attr-defined]
    return wrapper


def check_exports(namespace: dict[str, Any], prefix: str) -> None:
    """Wrap every function a module exports (its ``__all__``) with :func:`checked`, in place."""
    for name in namespace["__all__"]:
        value = namespace[name]
        if inspect.isfunction(value) and not getattr(value, "__mixprec_checked__", False):
            namespace[name] = checked(value, f"{prefix}.{name}")

