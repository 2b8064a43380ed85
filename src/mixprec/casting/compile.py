"""Compiling applied components (a policy's ``compile`` settings): the check that this
machine can honour them before anything is cast, and the compiled component ``revert`` undoes.
"""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from mixprec.casting.targets import ApplyError

__all__ = ["Compiled", "check_compiler", "any_on_cpu"]


class Compiled:
    """A component compiled by the policy (``nn.Module.compile``); :meth:`remove` undoes it.

    The compiled region is the component's call: its forward, mixprec's casts and
    scopes, and its children (traced without graph breaks, see ``tests/casting/test_compile.py``).
    Removing it drops the compiled code, so nothing compiled keeps the policy's dtypes.
    """

    def __init__(self, root: nn.Module, settings: Any) -> None:
        self.root = root
        root.compile(mode=settings.mode, dynamic=settings.dynamic, backend=settings.backend)

    def remove(self) -> None:
        self.root._compiled_call_impl = None


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
