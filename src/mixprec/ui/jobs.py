"""A browser session's background job: its cancel flag, its stream of progress, and its run id.

Each session gets its own idle :class:`Job`: the tab's ``gr.State(Job(index))`` is
deep-copied for every session, and a copy of a job is a new idle job of the same
:class:`JobIndex`. A Cancel in one browser tab never stops another tab's run.

Every run gets a fresh, unguessable id. The tab's :class:`JobIndex` finds a running
job by that id from any session, so a script whose calls do not share a session
(``gradio_client`` calls from two clients, the ``/call/<endpoint>`` HTTP route) can
cancel the run it started by passing the id the start endpoint returned; without the
id, nobody reaches a job of another session.

Examples:
    >>> job = Job()
    >>> [kind for kind, _ in job.stream(lambda report: report("half way") or 42)]
    ['started', 'progress', 'done']
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
import weakref
from typing import Any, Callable, Iterator

__all__ = ["Job", "JobIndex", "stop_all"]

#: ``target(report)``: does the work, calls ``report(event)`` as it goes, returns the result.
Target = Callable[[Callable[[Any], None]], Any]


class JobIndex:
    """The running jobs of one kind of run (one tab's Start button) in every session, by run id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, Job] = {}

    def find(self, run_id: str) -> Job | None:
        """The job running the run ``run_id``, or ``None`` when no run with that id is in progress."""
        with self._lock:
            return self._running.get(run_id)

    def _add(self, run_id: str, job: Job) -> None:
        with self._lock:
            self._running[run_id] = job

    def _remove(self, run_id: str) -> None:
        with self._lock:
            self._running.pop(run_id, None)


class Job:
    """One session's background work: at most one run at a time, cancellable.

    Args:
        index: where the runs of this job are found by id (default: an index of this job alone).

    Attributes:
        stop: set by :meth:`cancel`; the work polls :meth:`should_stop`.
    """

    def __init__(self, index: JobIndex | None = None) -> None:
        self.stop = threading.Event()
        self.index = index if index is not None else JobIndex()
        self._thread: threading.Thread | None = None
        self._run_id: str | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> Job:
        # Gradio deep-copies a state's initial value for each new session: that session gets
        # a new idle job in the same index (a run belongs to the session that started it).
        return Job(self.index)

    @property
    def running(self) -> bool:
        """Whether a run of this session is in progress."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def run_id(self) -> str | None:
        """The id of the run in progress, or ``None`` when nothing runs."""
        return self._run_id

    def should_stop(self) -> bool:
        """Whether a cancel was asked for (pass this as ``should_stop``)."""
        return self.stop.is_set()

    def cancel(self) -> bool:
        """Ask the running work to stop after its current step; returns whether anything was running."""
        if not self.running:
            return False
        self.stop.set()
        return True

    def find(self, run_id: str) -> Job | None:
        """The job of this job's index running ``run_id`` (in any session), or ``None``."""
        return self.index.find(run_id)

    def stream(self, target: Target, *, poll_s: float = 0.1) -> Iterator[tuple[str, Any]]:
        """Run ``target`` in a thread and follow it.

        Yields ``("started", run id)`` once the work runs, then ``("progress", event)``
        with the newest event whenever new ones arrived (older ones in between are
        skipped), then exactly one ``("done", result)`` or ``("error", exception)``.
        Closing the iterator early (the browser went away) asks the work to stop.

        Raises:
            RuntimeError: when this session's job is already running.
        """
        if self.running:
            raise RuntimeError("this session already has a run in progress")
        self.stop.clear()
        events: queue.Queue[tuple[str, Any]] = queue.Queue()
        run_id = secrets.token_urlsafe(16)

        def body() -> None:
            outcome: tuple[str, Any] = ("error", RuntimeError("the run ended without a result"))
            try:
                outcome = ("done", target(lambda event: events.put(("progress", event))))
            except Exception as exc:  # shown to the session that started the run
                outcome = ("error", exc)
            finally:
                self._run_id = None
                self.index._remove(run_id)
                events.put(outcome)

        self._run_id = run_id
        self.index._add(run_id, self)
        self._thread = threading.Thread(target=body, name="mixprec-ui-job", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            self._run_id = None
            self.index._remove(run_id)
            raise
        _STARTED.add(self)
        try:
            yield "started", run_id
            while True:
                try:
                    kind, value = events.get(timeout=poll_s)
                except queue.Empty:
                    continue
                latest, has_latest = None, False
                while kind == "progress":
                    latest, has_latest = value, True
                    try:
                        kind, value = events.get_nowait()
                    except queue.Empty:
                        kind = ""
                if has_latest:
                    yield "progress", latest
                if kind in ("done", "error"):
                    self._thread.join()
                    yield kind, value
                    return
        finally:
            if self._thread.is_alive():
                self.stop.set()


#: Every job that started a run, in any session and index: what :func:`stop_all` stops.
_STARTED: weakref.WeakSet[Job] = weakref.WeakSet()


def stop_all(wait_s: float = 60.0) -> tuple[int, int]:
    """Ask every running job to stop and wait, ``wait_s`` seconds at most in all, for them to end.

    For when the server stops (Ctrl-C): each run then ends as a cancel ends it, stored as
    ``cancelled`` with what it measured, its workers stopped. Returns how many were running
    and how many of them had not ended within ``wait_s``.
    """
    running = [job for job in list(_STARTED) if job.running]
    for job in running:
        job.stop.set()
    deadline = time.monotonic() + wait_s
    for job in running:
        if job._thread is not None:
            job._thread.join(max(0.0, deadline - time.monotonic()))
    return len(running), sum(job.running for job in running)
