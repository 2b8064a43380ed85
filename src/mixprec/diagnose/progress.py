"""Progress of a long profile: what it is doing, how far it is, and about how long is left.

:func:`mixprec.profile` counts the module calls of one plain fp32 run first (only when
progress is asked for), so each of its passes knows its total; a :class:`Meter` then
reports after module calls, at most once per ``interval`` seconds of its clock, with an
estimate from the rate so far. Without a callback, the ``mixprec`` logger gets a line
every 30 seconds when it logs at INFO.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

__all__ = ["ProfileProgress", "Meter", "log_progress"]

log = logging.getLogger("mixprec")


@dataclass(frozen=True)
class ProfileProgress:
    """One report of a running profile.

    Attributes:
        phase: what runs now (``counting module calls``, ``fp32 pass and own errors``,
            ``pass under the policy``).
        done: module calls finished in this phase.
        total: module calls this phase makes (from the counting run).
        elapsed_s: seconds since the profile started.
        left_s: about how many seconds are left, this phase and the next ones (None: not known yet).
    """

    phase: str
    done: int
    total: int
    elapsed_s: float
    left_s: float | None

    def text(self) -> str:
        left = "" if self.left_s is None else f", about {_duration(self.left_s)} left"
        share = f" ({self.done / self.total:.0%})" if self.total else ""
        return f"{self.phase}: {self.done}/{self.total} module calls{share}{left}"


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class Meter:
    """Counts module calls and reports to ``report`` at most every ``interval`` seconds.

    ``later_s`` estimates the phases after this one (seconds), so ``left_s`` covers the
    whole profile.
    """

    def __init__(self, report: Callable[[ProfileProgress], None], *, clock: Callable[[], float] = time.monotonic,
                 interval: float = 1.0, began: float | None = None):
        self.report, self.clock, self.interval = report, clock, interval
        self.began = clock() if began is None else began
        self.phase, self.done, self.total, self.later_s = "", 0, 0, 0.0
        self._phase_began = self.began
        self._last = -float("inf")

    def start(self, phase: str, total: int, later_s: float = 0.0) -> None:
        self.phase, self.done, self.total, self.later_s = phase, 0, total, later_s
        self._phase_began = self.clock()
        self._emit(self._phase_began)

    def tick(self) -> None:
        self.done += 1
        now = self.clock()
        if now - self._last >= self.interval or self.done == self.total:
            self._emit(now)

    def _emit(self, now: float) -> None:
        self._last = now
        spent = now - self._phase_began
        left = None
        if self.done and self.total:
            left = spent / self.done * max(0, self.total - self.done) + self.later_s
        self.report(ProfileProgress(self.phase, min(self.done, self.total) if self.total else self.done, self.total,
                                    now - self.began, left))


def log_progress(interval: float = 30.0) -> Callable[[ProfileProgress], None]:
    """A callback that logs a line on the ``mixprec`` logger at most every ``interval`` seconds."""
    last = [-float("inf")]

    def report(event: ProfileProgress) -> None:
        now = time.monotonic()
        if now - last[0] >= interval or (event.total and event.done >= event.total):
            last[0] = now
            log.info("mixprec profile: %s", event.text())

    return report
