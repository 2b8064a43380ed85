"""A browser session's background job: its cancel flag and its stream of progress.

Each session gets its own :class:`Job` from ``gr.State(Job)`` (Gradio calls the
class once per session), so a Cancel in one browser tab never stops another tab's
run, and nothing here is shared between sessions.

Example:
    >>> job = Job()
    >>> [kind for kind, _ in job.stream(lambda report: report("half way") or 42)]
    ['progress', 'done']
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator

__all__ = ["Job"]

#: ``target(report)``: does the work, calls ``report(event)`` as it goes, returns the result.
Target = Callable[[Callable[[Any], None]], Any]


class Job:
    """One session's background work: at most one run at a time, cancellable.

    Attributes:
        stop: set by :meth:`cancel`; the work polls :meth:`should_stop`.
    """

    def __init__(self) -> None:
        self.stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __deepcopy__(self, memo: dict[int, Any]) -> Job:
        # Gradio deep-copies a session's initial state value; a Job already belongs to one session.
        return self

    @property
    def running(self) -> bool:
        """Whether a run of this session is in progress."""
        return self._thread is not None and self._thread.is_alive()

    def should_stop(self) -> bool:
        """Whether a cancel was asked for (pass this as ``should_stop``)."""
        return self.stop.is_set()

    def cancel(self) -> bool:
        """Ask the running work to stop after its current step; returns whether anything was running."""
        if not self.running:
            return False
        self.stop.set()
        return True

    def stream(self, target: Target, *, poll_s: float = 0.1) -> Iterator[tuple[str, Any]]:
        """Run ``target`` in a thread and follow it.

        Yields ``("progress", event)`` with the newest event whenever new ones arrived
        (older ones in between are skipped), then exactly one ``("done", result)`` or
        ``("error", exception)``. Closing the iterator early (the browser went away)
        asks the work to stop.

        Raises:
            RuntimeError: when this session's job is already running.
        """
        if self.running:
            raise RuntimeError("this session already has a run in progress")
        self.stop.clear()
        events: queue.Queue[tuple[str, Any]] = queue.Queue()

        def body() -> None:
            outcome: tuple[str, Any] = ("error", RuntimeError("the run ended without a result"))
            try:
                outcome = ("done", target(lambda event: events.put(("progress", event))))
            except Exception as exc:  # shown to the session that started the run
                outcome = ("error", exc)
            finally:
                events.put(outcome)

        self._thread = threading.Thread(target=body, name="mixprec-ui-job", daemon=True)
        self._thread.start()
        try:
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
