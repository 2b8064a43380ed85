"""The public functions' arguments, checked at the door.

Every function :mod:`mixprec` (and :mod:`mixprec.gradio`) exports is wrapped once by
:func:`checked`: before the function runs, each argument is compared with its parameter's
annotation. A value of the wrong kind, or ``None`` where an object is needed, is refused
with a :class:`TypeError` in mixprec's words, naming the function, the parameter, what was
given and what is accepted, before anything changes. A preset's name is accepted wherever
a :class:`~mixprec.policy.Policy` is: it is resolved for the target's device, as
:func:`mixprec.apply` resolves it. A parameter named ``target`` (a model, a mapping of named
modules, or a pipeline) is checked as :func:`mixprec.apply` reads one.

An exported class is checked the same way where it is built: its constructor's arguments
against their annotations, for calls from outside mixprec (mixprec's own code builds its
classes from values it checked, and a policy file's values are refused with the file's
words by ``Policy.from_dict``). A constructor that refused a wrong kind with an error of
its own before (``PolicyError``, ``ValueError``) still does: the refusal is both.

The functions named ``real_context`` by :func:`check_exports` (``apply``, ``calibrate``,
``profile``, ``guard``) first refuse an unsupported context (a ``torch.func`` transform,
fake or functional dispatch, a trace) with the one check they all share,
:func:`mixprec.casting.targets.refuse_context`, before a preset's name is resolved (the
hardware probe cannot run there) and before anything changes.

The annotations are the single source: a function added to the public surface is checked
by being wrapped, and tests read the same signatures (:func:`parameters`). A wrapped
function keeps its signature and docstring and is pickled by its public name.
"""

from __future__ import annotations

import collections.abc
import functools
import importlib
import inspect
import numbers
import os
import sys
import types
import typing
from typing import Any, Callable

import torch

from mixprec._quote import clip

__all__ = ["checked", "check_exports", "accepts", "describe", "parameters", "ArgumentError"]


class ArgumentError(TypeError):
    """A public function was given a value of the wrong kind (a :class:`TypeError`)."""


@functools.lru_cache(maxsize=None)
def _also(error: type[Exception]) -> type[ArgumentError]:
    """An :class:`ArgumentError` that is also ``error``: where a wrong kind was refused with ``error`` before
    this layer, code catching it keeps working."""
    return types.new_class("ArgumentError", (ArgumentError, error), exec_body=lambda ns: ns.update(
        __module__=__name__, __doc__=ArgumentError.__doc__))


def _target_error(message: str) -> TypeError:
    """A target of the wrong kind: an :class:`ArgumentError` that is also an :class:`~mixprec.ApplyError`, as a
    bad target always was (code catching ``ApplyError`` keeps working)."""
    from mixprec.casting.targets import ApplyError

    return _also(ApplyError)(message)


#: Exported classes whose constructors refused a value of the wrong kind with an error of their own before
#: this layer: their refusal here is also that error (module, name).
_KEPT_ERRORS = {
    "mixprec.policy.rules.Policy": ("mixprec.policy.rules", "PolicyError"),
    "mixprec.policy.rules.Rule": ("mixprec.policy.rules", "PolicyError"),
    "mixprec.policy.rules.CompileSettings": ("mixprec.policy.rules", "PolicyError"),
    "mixprec.device.settings.NumericSettings": ("builtins", "ValueError"),
}


_ARTICLES = {"int": "an int", "float": "a number", "str": "a str", "Applied": "an Applied (what mixprec.apply returns)", "object": "an object",
             "TorchModule": "torch", "HasComponents": "a pipeline", "TuneStore": "a store", "Pipeline": "a Pipeline"}
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
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:  # a list of the items is taken as their tuple
            return isinstance(value, (tuple, list)) and all(accepts(v, args[0]) for v in value)
        if not isinstance(origin, type) or not isinstance(value, origin):
            return False
        if isinstance(value, (str, bytes)) and origin is not str and issubclass(origin, collections.abc.Sequence):
            return False  # a string is not a sequence of names
        if origin in (list, set, frozenset, collections.abc.Sequence, collections.abc.Set) and args:
            return all(accepts(v, args[0]) for v in value)
        if origin in (dict, collections.abc.Mapping) and len(args) == 2:
            return all(accepts(k, args[0]) and accepts(v, args[1]) for k, v in value.items())
        return True
    if annotation is float:  # any real number (numpy's too), not a bool
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if annotation is os.PathLike:
        return isinstance(value, os.PathLike)
    if getattr(annotation, "_is_protocol", False):  # what it must have, as a type checker reads a Protocol
        return all(hasattr(value, n) for n in _members(annotation))
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
    text = _ARTICLES.get(name, f"{'an' if name[:1] in 'AEIOU' else 'a'} {name}")
    if getattr(annotation, "_is_protocol", False):  # what it must have
        return f"{text} (an object with {', '.join('.' + m for m in _members(annotation))})"
    return text


def _members(protocol: Any) -> list[str]:
    """What a Protocol's objects must have: its public methods and attributes."""
    return sorted({n for n in (*vars(protocol), *getattr(protocol, "__annotations__", {})) if not n.startswith("_")})


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
    """A preset's name given where a Policy is: resolved for the target's device, as apply resolves it (the
    probe cannot run in an unsupported context: refused there first)."""
    from mixprec.calibration.trials import device_of
    from mixprec.casting.targets import components_of, refuse_context
    from mixprec.device.hardware import probe
    from mixprec.policy.presets import preset

    refuse_context(where)

    target = next((arguments[t] for t in _TARGETS if t in arguments), None)
    if target is None:
        return preset(value)
    components, hints = components_of(target)
    return preset(value, hardware=probe(device_of(components)), hints=hints)


def checked(fn: Callable[..., Any], where: str | None = None, *, real_context: bool = False,
            constructor: bool = False, error: type[ArgumentError] = ArgumentError) -> Callable[..., Any]:
    """``fn`` with its arguments checked against its annotations first (see the module docstring).

    Args:
        fn: a plain function.
        where: the name its messages give it (``mixprec.apply``).
        real_context: refuse an unsupported context first, with the check ``apply``, ``revert``, ``reapply``,
            ``profile``, ``guard`` and ``calibrate`` share (:func:`mixprec.casting.targets.refuse_context`).
        constructor: ``fn`` is a class's ``__init__``: ``self`` is not shown, and only calls from outside
            mixprec are checked.
        error: the refusal's class (an :class:`ArgumentError`).
    """
    where = where or f"mixprec.{fn.__name__}"
    signature = inspect.signature(fn)
    shown = signature.replace(parameters=list(signature.parameters.values())[1:]) if constructor else signature
    hints = _hints(fn)
    hints.pop("return", None)

    def check(args: tuple, kwargs: dict) -> inspect.BoundArguments:
        if real_context:
            from mixprec.casting.targets import refuse_context

            refuse_context(where)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise error(f"{where}: {exc}; its parameters: {shown}") from None
        names: list[str] = []
        for name, value in bound.arguments.items():
            param = signature.parameters[name]
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            annotation = hints.get(name, Any)
            if name in _TARGETS and annotation is Any:
                _check_target(where, name, value)
                continue
            if isinstance(value, str) and _is_policy(annotation) and not accepts(value, annotation):
                names.append(name)
                continue
            if not accepts(value, annotation):
                raise error(f"{where}: {name} must be {describe(annotation)}, not {_given(value)}")
        for name in names:  # every argument's kind first: a preset is resolved (the probe runs) only for a call that runs
            bound.arguments[name] = _preset_for(where, bound.arguments, bound.arguments[name])
        return bound

    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"{where}: checked() wraps plain functions")

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if constructor and (torch.compiler.is_dynamo_compiling() or _inside(sys._getframe(1))):
            return fn(*args, **kwargs)  # mixprec's own call (or one torch.compile traces: no frames to read there)
        bound = check(args, kwargs)
        return fn(*bound.args, **bound.kwargs)

    wrapper.__signature__ = signature  # type: ignore[attr-defined]
    wrapper.__mixprec_checked__ = True  # type: ignore[attr-defined]
    return wrapper


#: Modules a constructor's call passes through on its way from the code that asked for it.
_PASSING = frozenset({"dataclasses", "copy", "copyreg", "functools"})


def _inside(frame: types.FrameType | None) -> bool:
    """Whether a constructor was called by mixprec's own code (through ``dataclasses.replace`` and the like):
    it builds its classes from values it made, and refuses a policy file's with the file's words."""
    while frame is not None and frame.f_globals.get("__name__") in _PASSING:
        frame = frame.f_back
    module = frame.f_globals.get("__name__", "") if frame is not None else ""
    return module == "mixprec" or module.startswith("mixprec.")


def parameters(obj: Callable[..., Any]) -> list[tuple[inspect.Parameter, Any]]:
    """What :func:`checked` checks of a public function or class: each parameter (not ``*args``, ``**kwargs``
    or a constructor's ``self``) with its annotation (``Any`` where it has none). None for a class whose
    constructor is built in (an exception's message: anything)."""
    fn = obj.__init__ if isinstance(obj, type) else obj  # type: ignore[misc]
    if not inspect.isfunction(fn):
        return []
    fn = inspect.unwrap(fn)
    hints = _hints(fn)
    params = list(inspect.signature(fn).parameters.values())[1 if isinstance(obj, type) else 0:]
    return [(p, hints.get(p.name, Any)) for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def check_exports(namespace: dict[str, Any], prefix: str, *, real_context: tuple[str, ...] = ()) -> None:
    """Check what a module exports (its ``__all__``), in place: each function is wrapped with :func:`checked`
    (those named in ``real_context`` refuse an unsupported context first), each class's constructor too."""
    for name in namespace["__all__"]:
        value = namespace[name]
        if inspect.isfunction(value) and not getattr(value, "__mixprec_checked__", False):
            wrapper = checked(value, f"{prefix}.{name}", real_context=name in real_context)
            # pickled by reference to its public name (the defining module's name holds the unchecked function)
            wrapper.__module__, wrapper.__name__, wrapper.__qualname__ = prefix, name, name
            namespace[name] = wrapper
        elif isinstance(value, type) and inspect.isfunction(value.__init__) and \
                not getattr(value.__init__, "__mixprec_checked__", False):
            kept = _KEPT_ERRORS.get(f"{value.__module__}.{value.__qualname__}")
            error = _also(getattr(importlib.import_module(kept[0]), kept[1])) if kept else ArgumentError
            value.__init__ = checked(value.__init__, f"{prefix}.{name}", constructor=True, error=error)

