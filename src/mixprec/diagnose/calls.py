"""What the guard keeps per call: the recorded call (:class:`RecordedCall`), the state of
the calling thread (:class:`ThreadState`), and the lock that keeps a fallback's re-apply
from changing weights under a call in flight (:class:`CallLock`).

A guarded model may be called from several threads at once. Everything that describes
one call (how deep the guard is inside a component, whether it is re-running a call,
the call waiting for its finiteness check) belongs to the thread making that call. The
weights are shared: forwards read them, a fallback's re-apply rewrites them, so the
re-apply waits until no other thread is inside a guarded call, and new calls wait while
it runs.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

__all__ = ["RecordedCall", "ThreadState", "CallLock"]


def _rewind_points(args: tuple, kwargs: dict) -> list[tuple[Any, Any]]:
    # KV caches grow during a call; remember their state so a re-run starts from it.
    # transformers' Cache objects: their length. A plain dict or list handed to the call
    # (whisper's ``kv_cache``, filled by forward hooks on the key/value projections that
    # concatenate each call's keys): a shallow copy of its entries, put back in place
    # (a tensor written into in place is not). The cache's dtype is not converted: a
    # fallback that widens attention projections in the middle of a cached decoding
    # loop (rather than at its first call) needs a fresh cache.
    points: list[tuple[Any, Any]] = []
    for value in list(args) + list(kwargs.values()):
        static = _static_layers(value)
        if static:
            # A static cache (transformers 5's StaticCache): its tensors keep their size and
            # address; each layer's length is a tensor, put back in place.
            points.append((value, _StaticLengths([layer.cumulative_length.clone() for layer in static])))
        elif hasattr(value, "get_seq_length") and hasattr(value, "crop"):
            points.append((value, int(value.get_seq_length())))
        elif type(value) is dict:
            points.append((value, dict(value)))
        elif type(value) is list:
            points.append((value, list(value)))
    return points


def _static_layers(value: Any) -> list[Any]:
    layers = getattr(value, "layers", None)
    if not isinstance(layers, (list, tuple)) or not layers:
        return []
    static = [layer for layer in layers if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]
    return static if len(static) == len(layers) else []


class _StaticLengths(list):
    """Each layer's length of a static cache when the call started."""


@dataclass
class RecordedCall:
    """One entry call, kept so that it can be re-run exactly: same inputs, caches, random state.

    ``generation`` is the guard's policy generation when the call started: a call that
    overflowed under a policy another thread has since widened is re-run before anything
    is pinned for it.
    """

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    points: list[tuple[Any, Any]]
    rng: torch.Tensor
    cuda_rng: list[torch.Tensor] | None
    generators: list[tuple[torch.Generator, torch.Tensor]]
    generation: int = 0
    #: The first op a re-run got past by giving its inputs one dtype (``WidenMode.seen``'s entry).
    rescued: tuple | None = None
    #: The modules whose 16-bit tensors that op was handed.
    read: list[str] | None = None

    @classmethod
    def record(cls, fn: Callable[..., Any], args: tuple, kwargs: dict) -> RecordedCall:
        generators = [(g, g.get_state()) for g in list(args) + list(kwargs.values()) if isinstance(g, torch.Generator)]
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        return cls(fn, args, kwargs, _rewind_points(args, kwargs), torch.get_rng_state(), cuda, generators)

    def restore(self) -> None:
        """Rewind KV caches (and the dicts and lists the call was handed) and put every
        random generator back where the call started.

        Models draw noise inside a call (flow matching's ``randn_like``, sampling): a
        re-run from another random state would return another output. torch's default
        generator is one per process: a re-run on one thread resets it for all.
        """
        for cache, saved in self.points:
            if type(cache) is dict:
                cache.clear()
                cache.update(saved)
                continue
            if type(cache) is list:
                cache[:] = saved
                continue
            if isinstance(saved, _StaticLengths):
                for layer, length in zip(_static_layers(cache), saved):
                    layer.cumulative_length.copy_(length)
                    if int(length) == 0:
                        layer.is_initialized = False  # allocated again in the re-run's dtype
                continue
            length = saved
            grown = int(cache.get_seq_length()) - length
            if length == 0 and hasattr(cache, "reset"):
                cache.reset()  # drop the failed call's tensors entirely (their dtype too)
            elif grown > 0:
                cache.crop(-grown)  # a negative count removes that many tokens (transformers 4.x and 5.x)
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        for generator, state in self.generators:
            generator.set_state(state)


class ThreadState(threading.local):
    """The guard's state for the calling thread.

    Attributes:
        depth: per component, how many guarded calls of it are in progress on this thread
            (only the outermost one is checked).
        busy: this thread is re-running a call (localising, or after a pin): the guard
            steps aside for it.
    """

    def __init__(self) -> None:
        self.depth: defaultdict[str, int] = defaultdict(int)
        self.busy = False


class CallLock:
    """Forwards are readers, a re-apply is the writer.

    A guarded call holds a read for its whole duration; nested guarded calls on the same
    thread are granted at once. A writer waits until no other thread holds a read, and new
    outermost calls wait while a writer waits or runs. A thread that waits for the write
    (or for anything else that waits on writers, see :meth:`parked`) first sets its own
    reads aside: two threads that both need to re-apply in the middle of nested calls
    never wait for each other. Its own call in progress then sees the re-applied weights,
    as a single-threaded nested fallback does.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer: int | None = None
        self._waiting = 0
        self._mine = threading.local()

    def _held(self) -> int:
        return getattr(self._mine, "count", 0)

    @property
    def writers_waiting(self) -> int:
        """How many threads wait to re-apply (for a caller's progress report, and tests)."""
        return self._waiting

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        """Hold a read for the block: no re-apply runs until it ends."""
        me = threading.get_ident()
        with self._cond:
            if self._held() == 0 and self._writer != me:
                while self._writer is not None or self._waiting:
                    self._cond.wait()
            self._readers += 1
        self._mine.count = self._held() + 1
        try:
            yield
        finally:
            self._mine.count -= 1
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def parked(self) -> Iterator[None]:
        """Set this thread's reads aside for the block (while it waits), and take them back after."""
        mine = self._held()
        if not mine:
            yield
            return
        me = threading.get_ident()
        with self._cond:
            self._readers -= mine
            self._cond.notify_all()
        self._mine.count = 0
        try:
            yield
        finally:
            with self._cond:
                while self._writer is not None and self._writer != me:
                    self._cond.wait()
                self._readers += mine
            self._mine.count = mine

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        """Hold the write for the block: no other thread is inside a guarded call meanwhile."""
        me = threading.get_ident()
        if self._writer == me:  # already writing (a re-apply inside a re-apply's block)
            yield
            return
        with self.parked():
            with self._cond:
                self._waiting += 1
                try:
                    while self._writer is not None or self._readers:
                        self._cond.wait()
                finally:
                    self._waiting -= 1
                self._writer = me
            try:
                yield
            finally:
                with self._cond:
                    self._writer = None
                    self._cond.notify_all()
