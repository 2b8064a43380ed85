"""Casts only where the dtype changes: per-module wrappers that never changed a dtype come off.

Apply puts a :class:`~mixprec.casting.hooks.LeafCast` on every module that owns weights
in a mixed component, and an :class:`~mixprec.casting.hooks.AppEntry` on every block,
because it cannot know in advance where the model's own code makes tensors of another
dtype (``torch.arange``, a window, a sinusoidal embedding) or calls a block from its
own methods. Inside a region of one dtype almost none of them ever casts, yet each
costs a Python call per module call: on a GPU, where a decode step is launch-bound,
that Python work is the run time (a Chatterbox-scale decode made 28,100 wrapper calls).

:class:`Pruner` sits around a component's entry methods. After each of the first
:data:`LEARN_CALLS` outermost calls that succeed, every wrapper that was called and
never changed a dtype is taken off (``module.forward`` is the model's own again), and
wrappers that cast stay. A wrapper that was not called yet is decided at a later call.
Should a later call then fail with a dtype error (a path the first calls never took),
every pruned wrapper is put back and the call runs once more; the component keeps all
its wrappers from then on. Nothing is pruned while ``torch.compile`` traces (compiled
code pays nothing for a wrapper's check), and revert removes pruned and kept wrappers alike.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from mixprec.casting.frames import under_compile
from mixprec.casting.hooks import CallStack, ForwardWrapper, compiling
from mixprec.casting.meet import OP_ERRORS, may_be_about_dtypes

__all__ = ["Pruner", "LEARN_CALLS"]

#: Outermost component calls after which wrappers are decided (never-called ones stay).
LEARN_CALLS = 3




class Pruner:
    """Around every entry method of one applied component: prunes the wrappers of
    ``wrappers`` that its first calls show to be no-ops, and puts them back if a later
    call fails on a dtype."""

    def __init__(self, wrappers: list[ForwardWrapper], *, learn_calls: int = LEARN_CALLS) -> None:
        self.pending = list(wrappers)
        self.pruned: list[ForwardWrapper] = []
        self.left = learn_calls
        self._calls = CallStack()  # per thread: only the outermost call of the component decides
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, tuple]:
        return type(self), ([],)  # a copy of a model learns nothing from this one's calls

    def around(self, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if compiling():
            return call(*args, **kwargs)  # traced: nothing read or changed here, so nothing guarded
        if self.pending and under_compile():
            # Run eagerly inside a compiled call (below a graph break): compiled code pays
            # nothing for a wrapper's check, and taking one off would change what Dynamo
            # guards on (a recompile per prune). Nothing is pruned in this component.
            self.pending = []
        calls = self._calls.items
        if calls:
            return call(*args, **kwargs)
        calls.append(True)
        try:
            output = call(*args, **kwargs)
        except OP_ERRORS as exc:
            # Any op error may be a dtype clash on a path the first calls never took
            # (torch words them in many ways): with every wrapper back, the call finds out.
            if not self.pruned or not may_be_about_dtypes(exc):
                raise
            self.rearm()
            output = call(*args, **kwargs)  # with every wrapper; a second failure is the caller's to see
        finally:
            calls.pop()
        if self.pending:
            self.learn()
        return output

    def learn(self) -> None:
        """Decide the wrappers called so far: never cast, off; cast, kept."""
        with self._lock:
            if not self.pending:
                return
            undecided = []
            # Newest first: a wrapper installed later sits outside an older one on the
            # same forward, and only the outermost can come off.
            for wrapper in reversed(self.pending):
                if not wrapper.seen:
                    undecided.append(wrapper)
                elif not wrapper.needed and wrapper.prune():
                    self.pruned.append(wrapper)
            undecided.reverse()
            self.left -= 1
            self.pending = undecided if self.left > 0 else []

    def rearm(self) -> None:
        """Every pruned wrapper back on, and no more pruning in this component."""
        with self._lock:
            for wrapper in reversed(self.pruned):  # innermost first, as they were installed
                wrapper.rearm()
            self.pruned.clear()
            self.pending = []
            self.left = 0
