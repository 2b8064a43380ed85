"""Factory specs: a pipeline named by its code, ``module.path:factory`` or ``path/to/file.py:factory``, instead
of a registered name; this module owns parsing, normalising, importing and calling them (:func:`build_factory`)."""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mixprec.pipelines._base import Pipeline

__all__ = [
    "FactoryError",
    "build_factory",
    "is_factory_spec",
    "load_factory",
    "normalize_spec",
    "portable_spec",
]


class FactoryError(ValueError):
    """Raised for a factory spec (``module:attr`` or ``file.py:attr``) that cannot give a pipeline.

    The message starts with ``pipeline factory '<spec>':`` and says what was
    found instead (missing file, import error, missing attribute, what the
    factory raised or returned).
    """


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SPEC_FORMS = "module.path:factory or path/to/file.py:factory"
#: Modules loaded from factory files, by (absolute path, mtime_ns, size).
_file_modules: dict[tuple[str, int, int], types.ModuleType] = {}


def is_factory_spec(name: object) -> bool:
    """Whether ``name`` is a factory spec (it contains ``:``) rather than a registered name."""
    return isinstance(name, str) and ":" in name


def _split_spec(spec: str) -> tuple[str, str, bool]:
    """``(target, attribute path, is_file)`` of a spec; raises :class:`FactoryError` on bad syntax."""
    if not isinstance(spec, str) or ":" not in spec:
        raise FactoryError(f"pipeline factory {spec!r}: expected {_SPEC_FORMS}")
    target, _, attr = spec.strip().rpartition(":")  # the last ':' so that C:\\dir\\f.py:x works
    if not target:
        raise FactoryError(f"pipeline factory {spec!r}: nothing before ':'; expected {_SPEC_FORMS}")
    if not attr:
        raise FactoryError(
            f"pipeline factory {spec!r}: no factory name after ':'; expected {_SPEC_FORMS}"
        )
    parts = attr.split(".")
    if not all(_IDENTIFIER.match(p) for p in parts):
        raise FactoryError(
            f"pipeline factory {spec!r}: {attr!r} is not a Python name "
            "(expected e.g. build or Builder.create after ':')"
        )
    seps = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    is_file = target.endswith(".py") or any(sep in target for sep in seps)
    if not is_file and not all(_IDENTIFIER.match(p) for p in target.split(".")):
        raise FactoryError(
            f"pipeline factory {spec!r}: {target!r} is neither a path to a .py file nor a "
            f"dotted module name; expected {_SPEC_FORMS}"
        )
    return target, attr, is_file


def normalize_spec(spec: str) -> str:
    """Return ``spec`` with a file path made absolute, checking that the file exists.

    Benchmark and tune workers are separate processes: a spec sent to them must
    not depend on the current directory.  Module specs are returned unchanged
    (after checking their syntax); registered names are returned as they are.

    Raises:
        FactoryError: For bad syntax, or a file that does not exist or is not a ``.py`` file.
    """
    if not is_factory_spec(spec):
        return spec
    target, attr, is_file = _split_spec(spec)
    if not is_file:
        return f"{target}:{attr}"
    return f"{_check_file(spec, target)}:{attr}"


def _check_file(spec: str, target: str) -> Path:
    path = Path(target).expanduser()
    path = path if path.is_absolute() else Path.cwd() / path
    path = Path(os.path.normpath(path))
    if not path.exists():
        raise FactoryError(f"pipeline factory {spec!r}: file {str(path)!r} does not exist")
    if not path.is_file():
        raise FactoryError(f"pipeline factory {spec!r}: {str(path)!r} is not a file")
    if path.suffix != ".py":
        raise FactoryError(f"pipeline factory {spec!r}: {str(path)!r} is not a .py file")
    return path


def _where(exc: BaseException, filename: str | None = None) -> str:
    """`` (file line N)`` of the innermost frame of ``exc`` (in ``filename`` if given)."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return f" ({Path(exc.filename).name} line {exc.lineno})"
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__)
        if os.path.normpath(f.filename) != os.path.normpath(__file__)  # not the call made here
    ]
    if filename is not None:
        own = [f for f in frames if os.path.normpath(f.filename) == os.path.normpath(filename)]
        frames = own or frames
    if not frames:
        return ""
    return f" ({Path(frames[-1].filename).name} line {frames[-1].lineno})"


def _exited(exc: SystemExit) -> str:
    """What a factory that ended the interpreter did, and how to keep script code from running."""
    return (f"called sys.exit({exc.code!r}); a pipeline factory must return a pipeline, not end the program "
            "(keep script code under `if __name__ == \"__main__\":`)")


def _error_line(exc: BaseException) -> str:
    """``"Type: first line of the message"`` of an exception."""
    if isinstance(exc, SyntaxError) and exc.msg:
        return f"{type(exc).__name__}: {exc.msg}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _load_file_module(spec: str, path: Path) -> types.ModuleType:
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key in _file_modules:
        return _file_modules[key]
    stem = re.sub(r"\W", "_", path.stem)
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    module_name = f"mixprec_factory_{stem}_{digest}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:  # pragma: no cover - .py files always load
        raise FactoryError(f"pipeline factory {spec!r}: cannot load {str(path)!r} as Python")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
    # Like `python file.py`: the file's folder is importable while it runs (its siblings).
    folder = str(path.parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        module_spec.loader.exec_module(module)
    except SystemExit as exc:
        del sys.modules[module_name]
        raise FactoryError(f"pipeline factory {spec!r}: executing {str(path)!r} {_exited(exc)}") from None
    except Exception as exc:
        del sys.modules[module_name]
        raise FactoryError(
            f"pipeline factory {spec!r}: executing {str(path)!r} raised "
            f"{_error_line(exc)}{_where(exc, str(path))}"
        ) from exc
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)
    _file_modules[key] = module
    return module


def _import_module(spec: str, name: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except SystemExit as exc:
        sys.modules.pop(name, None)
        raise FactoryError(f"pipeline factory {spec!r}: importing module {name!r} {_exited(exc)}") from None
    except ImportError as exc:
        raise FactoryError(
            f"pipeline factory {spec!r}: cannot import module {name!r}: {_error_line(exc)}"
        ) from exc
    except Exception as exc:
        raise FactoryError(
            f"pipeline factory {spec!r}: importing module {name!r} raised "
            f"{_error_line(exc)}{_where(exc)}"
        ) from exc


def _defined_callables(module: types.ModuleType) -> list[str]:
    """Public callables defined in ``module`` itself (not imported into it)."""
    names = []
    for key, value in vars(module).items():
        if key.startswith("_") or not callable(value):
            continue
        if getattr(value, "__module__", None) == module.__name__:
            names.append(key)
    return names


def _missing_attribute(spec: str, where: str, owner: Any, missing: str) -> FactoryError:
    public = [n for n in dir(owner) if not n.startswith("_")]
    close = difflib.get_close_matches(missing, public, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    if isinstance(owner, types.ModuleType):
        defined = _defined_callables(owner)
        listing = (
            f" Callables defined there: {', '.join(defined[:12])}{', ...' if len(defined) > 12 else ''}."
            if defined else " It defines no public callables."
        )
    else:
        listing = ""
    return FactoryError(
        f"pipeline factory {spec!r}: {where} has no attribute {missing!r}.{hint}{listing}"
    )


def load_factory(spec: str) -> Callable[..., Any]:
    """Import the callable a factory spec names, without calling it.

    Args:
        spec: ``"module.path:factory"`` (imported with :mod:`importlib`) or
            ``"path/to/file.py:factory"`` (executed as a module; a relative path
            is taken from the current directory).  The part after the last
            ``:`` may be dotted, e.g. ``"pkg.mod:Builder.create"``.

    Returns:
        The callable.  A file is executed once per content version (by
        modification time and size) and then reused.

    Raises:
        FactoryError: If the file does not exist, the module cannot be imported
            (the message shows the import error's line), the attribute is missing
            (the message lists close names and the callables defined there), or
            the attribute is not callable.
    """
    target, attr, is_file = _split_spec(spec)
    if is_file:
        path = _check_file(spec, target)
        module = _load_file_module(spec, path)
        where = f"file {str(path)!r}"
    else:
        module = _import_module(spec, target)
        where = f"module {target!r}"
    obj: Any = module
    done: list[str] = []
    for part in attr.split("."):
        if not hasattr(obj, part):
            owner = f"{'.'.join(done)!r} in {where}" if done else where
            raise _missing_attribute(spec, owner, obj, part)
        obj = getattr(obj, part)
        done.append(part)
    if not callable(obj):
        raise FactoryError(
            f"pipeline factory {spec!r}: {attr!r} is a {type(obj).__name__} ({_short(obj)}), "
            "not a callable that returns a pipeline"
        )
    return obj


def _short(obj: Any, limit: int = 60) -> str:
    try:
        text = repr(obj)
    except Exception:  # a broken __repr__ must not hide the real error
        text = f"<{type(obj).__name__} object>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def accepted_keywords(factory: Callable[..., Any]) -> tuple[dict[str, inspect.Parameter], bool] | None:
    """``(named keyword parameters, accepts **kwargs)``, or ``None`` if it cannot be inspected."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    named = {
        name: p for name, p in signature.parameters.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    return named, var_kw


def build_factory(
    spec: str,
    *,
    size: str | None = None,
    seed: int | None = None,
    device: str | torch.device | None = None,
    **kwargs: Any,
) -> Pipeline:
    """Call the factory a spec names and return its pipeline (wrapped if need be).

    The factory is called with the keywords it accepts (by its signature):

    * ``size`` - when given and not ``"default"`` (``"default"`` means the
      factory's own default size), or when the factory requires it;
    * ``seed`` and ``device`` - when given;
    * ``**kwargs`` - always; a keyword the factory does not accept is an error.

    A factory without such parameters is called with no arguments; a ``device``
    it does not accept is applied afterwards with :meth:`Pipeline.to`.  A result
    that is not a :class:`Pipeline` is passed to :func:`mixprec.pipelines.wrap`.

    Args:
        spec: See :func:`load_factory`.
        size: Pipeline size (e.g. ``"test"``).
        seed: Seed of the weights.
        device: Device of the components.
        **kwargs: Further keywords for the factory.

    Raises:
        FactoryError: For everything :func:`load_factory` raises, keywords the
            factory does not accept, a factory that raises (the message shows its
            exception and where), and a result that is neither a
            :class:`Pipeline` nor accepted by ``wrap``.
    """
    factory = load_factory(spec)
    accepted = accepted_keywords(factory)
    call: dict[str, Any] = {}
    if accepted is not None:
        named, var_kw = accepted
        size_param = named.get("size")
        size_required = size_param is not None and size_param.default is inspect.Parameter.empty
        if size is not None and (size_param is not None or var_kw) and (size != "default" or size_required):
            call["size"] = size
        if seed is not None and ("seed" in named or var_kw):
            call["seed"] = seed
        if device is not None and ("device" in named or var_kw):
            call["device"] = device
        unknown = sorted(k for k in kwargs if k not in named and not var_kw)
        if unknown:
            raise FactoryError(
                f"pipeline factory {spec!r}: the factory does not accept {', '.join(unknown)}; "
                f"its parameters: {', '.join(named) or 'none'}"
            )
        call.update(kwargs)
    elif kwargs:
        raise FactoryError(
            f"pipeline factory {spec!r}: cannot tell which keywords the factory accepts, "
            f"so {', '.join(sorted(kwargs))} cannot be passed"
        )
    try:
        result = factory(**call)
    except SystemExit as exc:
        raise FactoryError(f"pipeline factory {spec!r}: the factory {_exited(exc)}") from None
    except Exception as exc:
        shown = ", ".join(f"{k}={v!r}" for k, v in call.items())
        try:
            source = inspect.getsourcefile(factory)
        except TypeError:
            source = None
        raise FactoryError(
            f"pipeline factory {spec!r}: the factory raised {_error_line(exc)}{_where(exc, source)} "
            f"when called as {getattr(factory, '__name__', 'factory')}({shown})"
        ) from exc
    pipeline = _as_pipeline(spec, result)
    if device is not None and "device" not in call and pipeline.device != torch.device(device):
        pipeline.to(device)
    return pipeline


def _as_pipeline(spec: str, result: Any) -> Pipeline:
    if isinstance(result, Pipeline):
        return result
    from mixprec.pipelines._wrap import wrap

    target, attr, is_file = _split_spec(spec)
    name = f"{Path(target).stem if is_file else target.rpartition('.')[2]}:{attr}"
    try:
        return wrap(result, name=name)
    except ValueError as exc:
        raise FactoryError(
            f"pipeline factory {spec!r}: the factory returned {type(result).__name__} "
            f"({_short(result)}), which is neither a mixprec.pipelines.Pipeline nor an object "
            f"mixprec.pipelines.wrap accepts: {exc}"
        ) from exc


def portable_spec(pipeline: str) -> str:
    """``pipeline`` as another process should get it: a factory file path made absolute."""
    try:
        return normalize_spec(pipeline)
    except FactoryError:
        return pipeline
