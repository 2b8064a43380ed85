"""Isolated workers: one fresh process per job, driven over a pipe.

Global torch state and memory high-water marks cannot leak between jobs because
each one lives in its own process. A job is a picklable dict and a ``serve(conn,
job)`` function that answers requests until it returns; the benchmark
(:func:`mixprec.bench.worker.serve`) and the tuner (:func:`mixprec.tuning.session.serve_tune`)
each bring their own, so this layer knows neither. Workers are started through the
small :class:`Executor` interface; :class:`LocalProcessExecutor` (spawned local
processes) is the default, and another executor (remote machines, a cluster) only
needs ``start(serve, job) -> Worker``.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import sys
import threading
import time
import traceback
from typing import Any, Callable, Iterator, Mapping, Protocol

from mixprec.measure._interrupts import ignore_in_child, starting_children

__all__ = ["Executor", "Serve", "Worker", "LocalProcessExecutor", "WorkerError", "WorkerCancelled", "WorkerTimeout",
           "WORKER_ENV"]

#: The environment a measuring worker (the benchmark's, the tuner's) starts with, unless the
#: caller's environment sets these itself. OpenMP threads that wait by sleeping instead of
#: spinning: on a CPU that other processes keep busy, a thread spinning at a barrier holds a core
#: its partner needs: fp32 runs of the tts pipeline at default size took 2 to 47 s (load 3 to 5,
#: 2 cores); waiting passively, 3.8 to 4.3 s. The test-size diffusion pipeline's fp32 run took
#: 1.5 to 3.5 CPU seconds spinning, 0.03 to 0.06 waiting passively (load 5, 2 cores).
WORKER_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}

#: What a worker process runs: answer requests on ``conn`` for ``job`` until done.
Serve = Callable[[Any, dict[str, Any]], None]


class WorkerError(RuntimeError):
    """The worker raised or died; the message carries its error."""


class WorkerCancelled(WorkerError):
    """The worker was stopped because its run was cancelled (the user's Ctrl-C): not a failure of its own."""


class WorkerTimeout(RuntimeError):
    """The worker did not answer within its time budget."""


class Worker(Protocol):
    def request(self, command: str, payload: Any = None, *, timeout: float | None = None) -> Any: ...

    def close(self) -> None: ...


class Executor(Protocol):
    def start(self, serve: Serve, job: dict[str, Any]) -> Worker: ...


# -- process side ------------------------------------------------------------------------


def _main(conn: Any, serve: Serve, job: dict[str, Any]) -> None:  # pragma: no cover - runs in the child process
    # This process is ours: keep the model libraries' progress bars and advice out of
    # the caller's terminal output (errors still reach the coordinator).
    for name in ("TRANSFORMERS_VERBOSITY", "DIFFUSERS_VERBOSITY"):
        os.environ.setdefault(name, "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        # The user's Ctrl-C is the coordinator's to answer: it stops this process (see _interrupts).
        ignore_in_child()
        serve(conn, job)
    except BaseException as exc:  # report every failure to the coordinator, then exit
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))
        except (BrokenPipeError, OSError):
            pass


# -- coordinator side --------------------------------------------------------------------


@contextlib.contextmanager
def _main_not_reimported(serve: Serve, job: dict[str, Any]) -> Iterator[None]:
    """While a worker starts, keep ``spawn`` from re-running the caller's main script in it.

    ``spawn`` imports the parent's ``__main__`` in every child so that objects pickled by
    reference to it can be found. A script that calls ``mixprec.tune(...)`` at module
    level, without ``if __name__ == "__main__":``, would then run again in each worker
    and start workers of its own. The worker needs nothing from ``__main__`` when its
    job refers to none of it: then the main module's path and spec are hidden for the
    moment :meth:`Process.start` records them, and the worker starts clean.
    """
    main = sys.modules.get("__main__")
    try:
        refers = b"__main__" in pickle.dumps((serve, job))
    except Exception:  # unpicklable: let multiprocessing report it as it does
        refers = True
    if main is None or refers:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.update(saved)
        if "__spec__" not in saved:
            main.__dict__.pop("__spec__", None)


_ENVIRON_LOCK = threading.Lock()


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    """While a worker starts, the variables of ``env`` that this process's environment does not set.

    A spawned process inherits the environment as it is when it starts, before it imports
    anything: libraries that read a variable once, when they load (OpenMP reads
    ``OMP_WAIT_POLICY``), see it there. This process's own environment is as it was afterwards.
    """
    added = {k: v for k, v in env.items() if k not in os.environ}
    with _ENVIRON_LOCK:
        os.environ.update(added)
        try:
            yield
        finally:
            for key in added:
                os.environ.pop(key, None)


class _ProcessWorker:
    def __init__(self, ctx: Any, serve: Serve, job: dict[str, Any], env: Mapping[str, str] | None = None):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_main, args=(child, serve, job), daemon=True, name=f"mixprec-{job.get('name', 'worker')}")
        try:
            # Started with SIGINT blocked: a Ctrl-C while it imports torch leaves it quiet; this process stops it.
            with _main_not_reimported(serve, job), _environment(env or {}), starting_children():
                self.process.start()
        except BaseException:  # an interrupt as it started: not left running, unknown to the caller
            if self.process.pid is not None:
                self.close()
            raise
        finally:
            child.close()

    def _receive(self, timeout: float | None, on_progress: Callable[[Any], None] | None = None) -> Any:
        """The answer, within ``timeout`` seconds in all; ``progress`` messages before it go to ``on_progress``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if not self.conn.poll(None if deadline is None else max(0.0, deadline - time.monotonic())):
                raise WorkerTimeout(f"no answer within {timeout:.0f} s")
            try:
                kind, payload = self.conn.recv()
            except (EOFError, OSError):
                self.process.join(1)
                raise WorkerError(f"worker died without a result (exit code {self.process.exitcode}{': killed, e.g. out of memory' if (self.process.exitcode or 0) < 0 else ''})") from None
            if kind == "error":
                raise WorkerError(payload)
            if kind != "progress":
                return payload
            if on_progress is not None:
                on_progress(payload)

    def wait_ready(self, timeout: float | None) -> Any:
        return self._receive(timeout)

    def request(self, command: str, payload: Any = None, *, timeout: float | None = None,
                on_progress: Callable[[Any], None] | None = None) -> Any:
        """Send ``command`` and wait for its answer; a serve loop's ``("progress", event)`` messages
        sent before the answer are handed to ``on_progress`` (and skipped without it)."""
        try:
            self.conn.send((command, payload))
        except (BrokenPipeError, OSError):
            raise WorkerError(f"worker died (exit code {self.process.exitcode})") from None
        return self._receive(timeout, on_progress)

    def close(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()


class LocalProcessExecutor:
    """Start each worker as a fresh local process (``spawn``: no state is inherited).

    Args:
        env: environment variables each worker starts with, where this process's
            environment does not set them (a variable set there wins); ``None``:
            :data:`WORKER_ENV`, as every measuring worker (bench's, the tuner's, a Ray
            actor's) starts; ``{}``: nothing added.
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._ctx = mp.get_context("spawn")
        self.env = dict(WORKER_ENV if env is None else env)

    def start(self, serve: Serve, job: dict[str, Any]) -> _ProcessWorker:
        return _ProcessWorker(self._ctx, serve, job, self.env)
