"""Progress of a tune run: what it does now, how far it is, and about how long is left.

:func:`mixprec.tune` reports a :class:`TuneProgress` from its start: while the pipeline
is built, after each run of the fp32 reference, of every candidate's evaluation, of the
held-out validation and of the final re-timing, after each pass of the risk profile (in
module calls), and after each candidate. :class:`TuneMeter` makes these events; its
estimates come only from durations measured on its clock (a test gives a scripted one):
the current step's from its own rate, or before its first run ends from the mean run
measured earlier; the whole search's from the mean measured evaluation times the
evaluations the budget has left.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from mixprec.diagnose.progress import Meter, ProfileProgress, duration_text
from mixprec.tuning.candidates import Candidate

__all__ = ["TuneMeter", "TuneProgress"]


@dataclass
class TuneProgress:
    """What a tune run's ``progress`` callback receives: during each step of the work, and after each candidate.

    Attributes:
        evaluations: measured evaluations so far (cache hits are free).
        budget: the evaluation budget (``None``: unlimited).
        latest: the candidate evaluated last (``None`` before the first, the fp32 baseline).
        best: the best candidate meeting the bound so far, if any.
        path: every candidate so far, in order (read-only).
        work: the step running now (what it is, runs or module calls done of its total, about
            how long it has left); ``None`` in the event sent when a candidate is done.
        elapsed_s: seconds since the tune run started.
        left_s: about how many seconds the search has left at most, with a budget: the current
            step's estimate plus the evaluations the budget has left, each as long as the
            evaluations measured so far took (``None``: no budget, or nothing measured yet).
    """

    evaluations: int
    budget: int | None
    latest: Candidate | None
    best: Candidate | None
    path: list[Candidate]
    work: ProfileProgress | None = None
    elapsed_s: float = 0.0
    left_s: float | None = None

    def text(self) -> str:
        """One line: the step and its estimate, the evaluations, the best so far, the search's estimate."""
        done = f"{self.evaluations}/{self.budget}" if self.budget is not None else f"{self.evaluations}"
        if self.work is not None:
            head = self.work.text()
        else:
            latest = self.latest
            head = (f"#{latest.index} {latest.step[:50]}: {latest.evaluation.latency_s:.3f} s"
                    f"{' (from the store)' if latest.cached else ''}" if latest is not None else "")
        best = self.best
        best_text = f"best #{best.index} {best.evaluation.latency_s:.3f} s" if best is not None else "none meets the bound yet"
        left = f"; search: up to about {duration_text(self.left_s)} left" if self.left_s is not None else ""
        return f"{head}; {done} evaluations; {best_text}{left}"


class TuneMeter:
    """Makes the :class:`TuneProgress` events of one tune run and sends them to ``report``.

    The tuner calls :meth:`begin` when a step starts (building the pipeline, profiling,
    validating, re-timing), :meth:`evaluating` and :meth:`evaluated` around each measured
    evaluation, and :meth:`candidate` after each candidate; the evaluator hands the
    events of its runs to :meth:`worker` (see :data:`mixprec.tuning.session.Report`).

    Args:
        report: receives every event.
        budget: the evaluation budget (``None``: unlimited).
        clock: monotonic seconds every duration and estimate is measured on.
        runs_per_evaluation: runs one evaluation makes (quality seeds + timed runs), for
            the search's estimate before an evaluation has been measured.
    """

    def __init__(self, report: Callable[[TuneProgress], None], *, budget: int | None = None,
                 clock: Callable[[], float] = time.monotonic, runs_per_evaluation: int | None = None):
        self.report, self.budget, self.clock = report, budget, clock
        self.runs_per_evaluation = runs_per_evaluation
        self.search: Any = None  # set once the search exists: its count, path and best go in every event
        self.began = clock()
        self._meter = Meter(self._work, clock=clock, interval=0.0, began=self.began)
        self._step = ""
        self._key: tuple[str, str | None] | None = None
        self._counted = False  # the step's total came from begin(): the runs the evaluator reports are not its steps
        self._prefix = True
        self._phase_began = self.began
        self._run_s: float | None = None  # seconds per run, from the last step counted in runs
        self._evaluation_s: list[float] = []
        self._evaluation_began: float | None = None

    # -- what the tuner says ------------------------------------------------------------------

    def begin(self, step: str, total: int = 0, *, unit: str = "runs", runs: int | None = None,
              prefix: bool = True) -> None:
        """A step starts (reported at once). ``total``: its steps when the tuner counts them itself
        (:meth:`tick`); ``runs``: the runs it will make, for an estimate from the mean run so far;
        ``prefix``: the phases the evaluator reports are named after this step (else on their own)."""
        self._step, self._key, self._counted = step, (step, None), total > 0
        self._prefix = prefix
        self._phase_began = self.clock()
        runs = runs if runs is not None else (total if unit == "runs" else None)
        estimate = runs * self._run_s if runs and self._run_s is not None else None
        self._meter.start(step, total, unit=unit, estimate_s=estimate)

    def tick(self) -> None:
        """One step of a step the tuner counts (:meth:`begin` with a ``total``) is done."""
        self._note_rate(self._meter.done + 1)
        self._meter.tick()

    def evaluating(self, index: int, step: str) -> None:
        """The search measures candidate ``index`` (``step``) now."""
        self._evaluation_began = self.clock()
        self.begin(f"measuring #{index} {step[:50]}", runs=self.runs_per_evaluation)

    def evaluated(self) -> None:
        """The evaluation begun by :meth:`evaluating` is done: its duration feeds the search's estimate."""
        if self._evaluation_began is not None:
            self._evaluation_s.append(self.clock() - self._evaluation_began)
            self._evaluation_began = None

    def candidate(self, cand: Candidate) -> None:
        """Candidate ``cand`` is on the path: the event with ``latest`` set and no ``work``."""
        self.report(self._event(cand, None, None))

    # -- what the evaluator's runs say ------------------------------------------------------

    def worker(self, event: dict[str, Any]) -> None:
        """An event of the evaluator's runs: its work begun (``done`` 0) or a step of it done."""
        if self._counted:
            return
        phase, done, total = event.get("phase"), int(event.get("done", 0)), int(event.get("total", 0))
        unit = str(event.get("unit") or "runs")
        key = (self._step, phase)
        if key != self._key or done == 0:
            self._key = key
            self._phase_began = self.clock()
            label = f"{self._step}: {phase}" if phase and self._step and self._prefix else (phase or self._step)
            estimate = total * self._run_s if unit == "runs" and total and self._run_s is not None else None
            self._meter.start(label, total, unit=unit, estimate_s=estimate)
            if done == 0:
                return
        self._note_rate(done)
        self._meter.reach(done)

    # -- the events ---------------------------------------------------------------------------

    def _note_rate(self, done: int) -> None:
        """Seconds per run, from the runs of this step so far (``done`` of them finished now)."""
        if self._meter.unit == "runs" and done > 0:
            self._run_s = (self.clock() - self._phase_began) / done

    def _per_evaluation(self) -> float | None:
        if self._evaluation_s:
            return statistics.mean(self._evaluation_s)
        if self.runs_per_evaluation and self._run_s is not None:
            return self.runs_per_evaluation * self._run_s
        return None

    def _work(self, work: ProfileProgress) -> None:
        self.report(self._event(None, work, work.left_s))

    def _event(self, cand: Candidate | None, work: ProfileProgress | None, step_left: float | None) -> TuneProgress:
        search = self.search
        path = search.path if search is not None else []
        measured = search.measured if search is not None else 0
        left = None
        per = self._per_evaluation()
        if self.budget is not None and per is not None:
            evaluating = self._evaluation_began is not None
            remaining = max(0, self.budget - measured - (1 if evaluating else 0))
            left = remaining * per + ((step_left or 0.0) if evaluating else 0.0)
        latest = cand if cand is not None else (path[-1] if path else None)
        return TuneProgress(measured, self.budget, latest, search.best() if search is not None else None, path,
                            work, self.clock() - self.began, left)
