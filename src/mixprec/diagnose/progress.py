"""Progress of long work: what it is doing, how far it is, and about how long is left.

:class:`Meter` turns counted steps (module calls, runs) into :class:`ProfileProgress`
reports with an estimate from the rate measured so far; :func:`mixprec.profile` and
:func:`mixprec.tune` report through it.

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

__all__ = ["ProfileProgress", "Meter", "duration_text", "log_progress"]

log = logging.getLogger("mixprec")


@dataclass(frozen=True)
class ProfileProgress:
    """One report of running work (a profile's pass, a tune's runs).

    Attributes:
        phase: what runs now (``counting module calls``, ``fp32 pass and own errors``,
            ``pass under the policy``; ``fp32 reference`` in a tune).
        done: steps finished in this phase.
        total: steps this phase makes (0: not counted, e.g. while a pipeline is built).
        elapsed_s: seconds since the work started.
        left_s: about how many seconds are left, this phase and the next ones (None: not known yet).
        unit: what a step is (``module calls``, ``runs``).
    """

    phase: str
    done: int
    total: int
    elapsed_s: float
    left_s: float | None
    unit: str = "module calls"

    def text(self) -> str:
        left = "" if self.left_s is None else f", about {duration_text(self.left_s)} left"
        if not self.total:
            return f"{self.phase}{left}"
        share = f" ({self.done / self.total:.0%})"
        return f"{self.phase}: {self.done}/{self.total} {self.unit}{share}{left}"


def duration_text(seconds: float) -> str:
    """``42 s``, or ``3 min 05 s`` from a minute on."""
    seconds = max(0, round(seconds))
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class Meter:
    """Counts steps and reports to ``report`` at most every ``interval`` seconds (and at a phase's end).

    ``later_s`` estimates the phases after this one (seconds), so ``left_s`` covers the
    whole work; ``estimate_s`` is the phase's own estimate before its first step ends
    (e.g. from a run measured earlier), replaced by the measured rate once a step has.
    """

    def __init__(self, report: Callable[[ProfileProgress], None], *, clock: Callable[[], float] = time.monotonic,
                 interval: float = 1.0, began: float | None = None):
        self.report, self.clock, self.interval = report, clock, interval
        self.began = clock() if began is None else began
        self.phase, self.done, self.total, self.later_s = "", 0, 0, 0.0
        self.unit, self.estimate_s = "module calls", None
        self._phase_began = self.began
        self._last = -float("inf")

    def start(self, phase: str, total: int, later_s: float = 0.0, *, unit: str | None = None,
              estimate_s: float | None = None) -> None:
        self.phase, self.done, self.total, self.later_s = phase, 0, total, later_s
        self.unit = unit or self.unit
        self.estimate_s = estimate_s
        self._phase_began = self.clock()
        self._emit(self._phase_began)

    def tick(self) -> None:
        self.reach(self.done + 1)

    def reach(self, done: int) -> None:
        """``done`` steps of this phase are finished (reported as :meth:`tick` reports)."""
        self.done = done
        now = self.clock()
        if now - self._last >= self.interval or self.done == self.total:
            self._emit(now)

    def _emit(self, now: float) -> None:
        self._last = now
        spent = now - self._phase_began
        left = None
        if self.done and self.total:
            left = spent / self.done * max(0, self.total - self.done) + self.later_s
        elif self.estimate_s is not None:
            left = max(0.0, self.estimate_s - spent) + self.later_s
        self.report(ProfileProgress(self.phase, min(self.done, self.total) if self.total else self.done, self.total,
                                    now - self.began, left, self.unit))


def log_progress(interval: float = 30.0) -> Callable[[ProfileProgress], None]:
    """A callback that logs a line on the ``mixprec`` logger at most every ``interval`` seconds."""
    last = [-float("inf")]

    def report(event: ProfileProgress) -> None:
        now = time.monotonic()
        if now - last[0] >= interval or (event.total and event.done >= event.total):
            last[0] = now
            log.info("mixprec profile: %s", event.text())

    return report
