"""mixprec's own frames under ``torch.compile``: one compiled entry per module, everything else inlined.

Apply's casts, scopes and the guard's checks run as Python around the model's code
(method hooks, ``forward`` wrappers). Where a compiled component traces without a break,
Dynamo inlines them into the component's graph. Where the model's own code breaks the
graph (an LSTM, a data-dependent branch), Dynamo compiles every frame that was on the
stack as a frame of its own, and mixprec's frames share their code objects across every
module they wrap: one ``wrapper`` code served each hooked method, so each module, each
argument count and each position in the hook chain was one more recompile of the same
code, until Dynamo's recompile limit (8 per code object) made the rest run eagerly.

:func:`inline_only` marks the code of mixprec's runtime modules so that Dynamo never
compiles them as frames of their own, while it still inlines them wherever it traces
through them (the mark is read when a frame starts, not when a call is inlined). After a
model's graph break, the few casts on that path then run eagerly, and the model's own
frames below them are compiled as they are without mixprec. Nothing on ``torch`` is
changed: the mark is the per-code setting ``torch.compiler.disable(recursive=False)``
and Dynamo's own helpers use.

:func:`under_compile` tells code that runs eagerly inside a compiled call (after a
graph break) that it is inside one.
"""

from __future__ import annotations

import itertools
import sys
import threading
import types
from typing import Any, Iterator

import torch

__all__ = ["inline_only", "under_compile", "own_code", "RUNTIME_PACKAGES"]

#: Packages whose code runs inside a model's call: apply's hooks, the guard, profiling.
#: The reference pipelines (``mixprec.pipelines``) are model code and are compiled as any app's.
RUNTIME_PACKAGES = ("mixprec.casting", "mixprec.diagnose", "mixprec.measure", "mixprec.policy")

_marked: set[str] = set()
_numbers = itertools.count()
_lock = threading.Lock()


def _skip_strategy() -> Any:
    """The code setting 'skip this frame, trace what it calls' of this torch, or ``None``."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:  # torch before the per-code strategies (< 2.6)
        return None
    strategy = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.DEFAULT)
    return lambda code: set_code_exec_strategy(code, strategy)


def _codes(obj: Any, seen: set[int]) -> Iterator[types.CodeType]:
    """Every code object of ``obj`` (a function, method, property or class) and the code nested in it."""
    if isinstance(obj, type):
        for value in vars(obj).values():
            yield from _codes(value, seen)
        return
    if isinstance(obj, property):
        for fn in (obj.fget, obj.fset, obj.fdel):
            yield from _codes(fn, seen)
        return
    obj = getattr(obj, "__func__", obj)  # staticmethod, classmethod
    code = getattr(obj, "__code__", None)
    stack = [code] if isinstance(code, types.CodeType) else []
    while stack:
        code = stack.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        yield code
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


def inline_only() -> int:
    """Mark the code of mixprec's loaded runtime modules as inline-only under Dynamo; returns how many
    code objects were newly marked. Idempotent and cheap (modules already marked are skipped)."""
    mark = _skip_strategy()
    if mark is None:
        return 0
    count = 0
    with _lock:
        for name in [n for n in list(sys.modules) if n.startswith(RUNTIME_PACKAGES) and n not in _marked]:
            module = sys.modules.get(name)
            if module is None:
                continue
            seen: set[int] = set()
            for value in list(vars(module).values()):
                if getattr(value, "__module__", None) != name:
                    continue  # imported from elsewhere: marked with its own module, or not ours
                for code in _codes(value, seen):
                    mark(code)
                    count += 1
            _marked.add(name)
    return count


def own_code(fn: Any, label: str) -> Any:
    """Give ``fn`` (a wrapper made for one module) a code object of its own, named after ``label``.

    A wrapper installed as a module's ``forward`` is where Dynamo starts compiling that
    module (torch's ``_call_impl`` is not compiled itself). Dynamo keeps compiled code and
    counts recompiles per code object: wrappers sharing one code would compile once per
    module into the same cache until its recompile limit. A copy of the code (a different
    name, the same bytecode) is not marked by :func:`inline_only`, so it is compiled where
    it is the outermost frame and inlined everywhere else.
    """
    # Numbered: Dynamo's automatic-dynamic memory of input shapes is keyed by file, line and
    # name, and two modules' shapes must not mark each other's dimensions dynamic.
    name = "".join(c if c.isalnum() else "_" for c in label) + f"_{next(_numbers)}"
    fn.__code__ = fn.__code__.replace(co_name=name, **({"co_qualname": name} if hasattr(fn.__code__, "co_qualname") else {}))
    return fn


try:
    from torch._C._dynamo.eval_frame import get_eval_frame_callback as _eval_frame_callback
except ImportError:  # a torch without it: only traced code counts as compiled
    def _eval_frame_callback() -> Any:
        return None


def under_compile() -> bool:
    """Whether this code runs inside a compiled call: traced, or eagerly after a graph break."""
    return torch.compiler.is_compiling() or _eval_frame_callback() not in (None, False)
