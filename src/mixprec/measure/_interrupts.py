"""The user's interrupt (Ctrl-C) and the worker processes mixprec starts.

A terminal's Ctrl-C sends SIGINT to every process of its foreground process group: the
coordinator and each worker it started. A worker must not answer it: one still starting
(importing torch, unpickling its job) would print a traceback, before any code of ours
could install a handler. So a worker starts with SIGINT blocked, a mask it inherits from
the thread that starts it (:func:`starting_children`) and holds from its first
instruction; once running, it ignores SIGINT (:func:`ignore_in_child`). The coordinator
alone answers the interrupt: it stops its workers and stores what was measured.

CPython starts its own resource tracker this way, and Ray its processes
(``pthread_sigmask(SIG_BLOCK, {SIGINT})`` before the child starts).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from multiprocessing import resource_tracker
from typing import Iterator

from mixprec._signals import held_interrupt

__all__ = ["starting_children", "ignore_in_child"]

_SIGINT = {signal.SIGINT} if hasattr(signal, "pthread_sigmask") else set()


@contextlib.contextmanager
def starting_children() -> Iterator[None]:
    """While processes start here, SIGINT is blocked in this thread, so they start with it blocked.

    In the main thread an interrupt that comes meanwhile is held back and raised (its handler
    called) when the block ends (:func:`mixprec._signals.held_interrupt`): a child being
    started is never left half started, unknown to the caller that would stop it.
    """
    if not _SIGINT:  # no signal masks (Windows): a console's Ctrl-C reaches each process in its own way
        yield
        return
    # multiprocessing's resource tracker, started with a spawned process's first start, unblocks SIGINT in
    # the starting thread once it has started: started now, before the block, it leaves the block in place.
    resource_tracker.ensure_running()
    with held_interrupt():
        before = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGINT)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)  # a SIGINT pending on this thread arrives now


def ignore_in_child() -> None:
    """In a worker started by :func:`starting_children`: ignore SIGINT from now on (one that came
    while it started is dropped), and let the coordinator stop it.

    Only a worker's own process does this: where the worker is a thread of a process another
    system runs (a Ray actor's, whose signals Ray answers), nothing changes.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if _SIGINT:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGINT)
