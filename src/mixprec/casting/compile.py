"""Compiling applied components (a policy's ``compile`` settings): the check that this
machine can honour them before anything is cast, and the compiled component ``revert`` undoes.
"""

from __future__ import annotations

import os
import re
from typing import Any

import torch
from torch import nn

from mixprec.casting.targets import ApplyError

__all__ = ["Compiled", "CompileUnsupported", "check_compiler", "any_on_cpu", "missing_torch_feature", "TORCH_ADDED"]

#: torch functions that model libraries call while traced, and the first torch release that
#: has each (transformers 5's attention masks call ``torch.compiler.is_exporting``).
TORCH_ADDED = {"torch.compiler.is_exporting": "2.7"}

_NO_ATTRIBUTE = re.compile(r"module '(torch(?:\.\w+)*)' has no attribute '(\w+)'")


class CompileUnsupported(RuntimeError):
    """A compiled component failed while traced because this torch lacks what the model's
    code calls; the message names it and the torch that has it."""


def missing_torch_feature(exc: BaseException) -> str | None:
    """What to tell the user when ``exc`` is torch.compile failing on a torch function this torch lacks.

    Model code often calls newer torch functions behind ``try`` / ``except`` (so it runs
    eagerly on an older torch), but an older Dynamo fails internally when it traces the
    missing attribute (``InternalTorchDynamoError: AttributeError: module 'torch.compiler'
    has no attribute 'is_exporting'``). Returns ``None`` for any other error.
    """
    from torch._dynamo.exc import TorchDynamoException

    if not isinstance(exc, TorchDynamoException):
        return None
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found = _NO_ATTRIBUTE.search(str(current))
        if found:
            name = f"{found.group(1)}.{found.group(2)}"
            since = TORCH_ADDED.get(name)
            has = f"torch {since} and later have it" if since else "a newer torch may have it"
            needs = f"torch {since} or later" if since else "a newer torch"
            return (f"torch.compile failed inside the model's code, not in mixprec's: it calls {name}, which torch "
                    f"{torch.__version__} does not have ({has}). Compiling this model needs {needs}; or run the "
                    "policy without compile (its casts work the same uncompiled)")
        current = current.__cause__ or current.__context__
    return None


class Compiled:
    """A component compiled by the policy (``nn.Module.compile``); :meth:`remove` undoes it.

    The compiled region is the component's call: its forward, mixprec's casts and
    scopes, and its children (traced without graph breaks, see ``tests/casting/test_compile.py``).
    Removing it drops the compiled code, so nothing compiled keeps the policy's dtypes.
    A call that fails because the model's code needs a newer torch to be traced raises
    :class:`CompileUnsupported`, naming what is missing (:func:`missing_torch_feature`).
    """

    def __init__(self, root: nn.Module, settings: Any) -> None:
        from mixprec.casting.decode import StaticDecode

        self.root = root
        root.compile(mode=settings.mode, dynamic=settings.dynamic, backend=settings.backend)
        compiled = root._compiled_call_impl
        #: A decoder's static key/value cache (``None`` for other components).
        self.decode = StaticDecode(root) if StaticDecode.applies(root) else None
        decode = self.decode

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                if decode is not None:
                    return decode.call(compiled, root._call_impl, args, kwargs)
                return compiled(*args, **kwargs)
            except Exception as exc:
                reason = missing_torch_feature(exc)
                if reason is None:
                    raise
                raise CompileUnsupported(reason) from exc

        root._compiled_call_impl = call

    def remove(self) -> None:
        self.root._compiled_call_impl = None
        if self.decode is not None:
            self.decode.remove()


def check_compiler(settings: Any, on_cpu: bool) -> None:
    """Refuse a compile setting this machine cannot honour, before anything is cast.

    The inductor backend generates C++ for CPU tensors and needs a compiler (``$CXX``,
    else ``g++``, ``c++`` or ``clang++`` on ``PATH``).

    Raises:
        ApplyError: naming what is missing and what would work instead.
    """
    import shutil

    if settings.backend != "inductor":
        return
    candidates = [c for c in (os.environ.get("CXX"), "g++", "c++", "clang++") if c]
    if on_cpu and not any(shutil.which(c) for c in candidates):
        raise ApplyError("policy compile: the inductor backend needs a C++ compiler for CPU tensors and none was found "
                         f"(looked for {', '.join(candidates)}); install g++, set CXX, or use compile backend "
                         "'aot_eager' or 'eager' (traced, no generated code)")


def any_on_cpu(comps: dict[str, nn.Module]) -> bool:
    """Whether any component has a parameter on the CPU (where inductor needs a C++ compiler)."""
    return any(p.device.type == "cpu" for root in comps.values() for p in root.parameters())
