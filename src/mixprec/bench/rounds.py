"""How many timed rounds a batch gets, and what the paired samples say.

Each round runs the fp32 reference and then every configuration once, so round ``r``
of a configuration and round ``r`` of the reference were timed under the same
conditions: their ratio is one paired measurement (:func:`mixprec.measure.stats.paired_ratio`).

:class:`RoundKeeper` decides, before each round, whether to run it:

- **behind the budget**: when the rounds left would end past the deadline, the
  warm-ups left are cut, then the planned timed rounds as each stops fitting, and
  only when not even one round fits before any was timed are the slowest
  configurations dropped; each is named in the run's notes;
- **adaptive rounds**: with a budget, after the planned rounds, rounds are added (as many
  again as planned, and at least up to :data:`~mixprec.measure.stats.MIN_INTERVAL_PAIRS`) while
  some configuration's speed ratio has no 95% interval yet (too few pairs: only their
  range) or an interval wider than :data:`~mixprec.measure.stats.TARGET_WIDTH`, and the
  budget allows one more; those still wide at the end are named as undecided.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from mixprec._quote import few
from mixprec.measure.stats import MIN_INTERVAL_PAIRS, TARGET_WIDTH, Ratio, cv, paired_ratio

__all__ = ["RoundKeeper", "paired", "unsettled", "speed_metrics", "load_note", "runnable_others", "MIN_TIMED"]

#: Fewer timed rounds than this give no interval worth a decision.
MIN_TIMED = 3


def paired(reference: tuple[Sequence[int], Sequence[float]], candidate: tuple[Sequence[int], Sequence[float]]) -> Ratio | None:
    """The paired speed ratio of ``candidate`` against ``reference``, each given as
    (round indexes, seconds); rounds only one of them has are left out."""
    ref = dict(zip(*reference))
    pairs = [(ref[r], s) for r, s in zip(*candidate) if r in ref]
    if not pairs:
        return None
    return paired_ratio([p[0] for p in pairs], [p[1] for p in pairs])


def unsettled(ratio: Ratio) -> bool:
    """Whether a configuration's speed ratio asks for another round (within a budget): fewer than
    :data:`MIN_TIMED` pairs, no 95% interval yet (too few pairs for one: only their range, and three
    rounds all faster happen one time in eight by chance), or an interval wider than
    :data:`~mixprec.measure.stats.TARGET_WIDTH`."""
    return ratio.n < MIN_TIMED or not ratio.exact or ratio.width > TARGET_WIDTH


def speed_metrics(ratio: Ratio | None, samples: Sequence[float], unstable: str | None) -> dict[str, Any]:
    """The stored speed figures of one configuration: its paired speed-up and interval,
    its samples' coefficient of variation, and whether they were found unstable
    (``unstable``: :func:`~mixprec.measure.stats.instability`'s reason, or None)."""
    metrics: dict[str, Any] = {}
    if ratio is not None:
        metrics.update(speedup=ratio.value, speedup_ci_low=ratio.low, speedup_ci_high=ratio.high, speedup_pairs=ratio.n)
    spread = cv(samples)
    if spread is not None:
        metrics["latency_cv"] = spread
    metrics["unstable"] = 1.0 if unstable else 0.0
    return metrics


#: Where :func:`runnable_others` reads the kernel's count (tests point it at a file of their own).
PROC_STAT = "/proc/stat"


def runnable_others() -> int | None:
    """Processes ready to run on this machine right now, besides the one asking
    (``procs_running`` of ``/proc/stat``); None where the platform does not say.

    Sampled between timed calls, when the benchmark's own workers are idle, it counts
    other jobs competing for the cores, unlike the load average, which the
    benchmark's own worker processes raise while they load.
    """
    try:
        with open(PROC_STAT, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("procs_running "):
                    return max(0, int(line.split()[1]) - 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def load_note(samples: Sequence[int], cores: int | None = None) -> str | None:
    """A note when other jobs kept the cores busy during the timed rounds: the median
    of the ``samples`` of :func:`runnable_others` at or above the cores."""
    if not samples:
        return None
    cores = cores or os.cpu_count() or 1
    ordered = sorted(samples)
    busy = ordered[len(ordered) // 2]
    if busy >= cores:
        return (f"the machine was loaded: a median of {busy} other runnable processes on {cores} cores during the "
                "timed rounds; timings are noisier than on a quiet machine")
    return None


@dataclass
class RoundKeeper:
    """Decides round by round; ``notes`` collects what it cut, dropped or could not decide.

    ``clock`` gives the monotonic seconds the ``deadline`` is on (tests script it).
    """

    warmup: int
    repeat: int
    deadline: float | None
    batch: int
    extra: int = 0
    notes: list[str] = field(default_factory=list)
    busy: list[int] = field(default_factory=list)  # other runnable processes, sampled before each round
    clock: Callable[[], float] = time.monotonic
    _last: float = 0.0
    _started: float | None = None

    def __post_init__(self) -> None:
        # Adaptive rounds only within a budget: as many again as planned, and at least enough
        # to reach the pairs a 95% interval needs, at most.
        self.extra = max(self.repeat, MIN_INTERVAL_PAIRS - self.repeat) if self.deadline is not None else 0

    def start_round(self) -> None:
        self._started = self.clock()
        others = runnable_others()
        if others is not None:
            self.busy.append(others)

    def end_round(self) -> None:
        if self._started is not None:
            self._last = self.clock() - self._started

    def fits(self, rounds: int, now: float | None = None) -> bool:
        if self.deadline is None:
            return True
        return (self.clock() if now is None else now) + rounds * self._last * 1.1 <= self.deadline

    def go_on(self, index: int, wide: Callable[[], list[tuple[str, Ratio]]],
              slow_first: Callable[[], list[tuple[str, Any, float]]]) -> tuple[bool, list[Any]]:
        """Whether to run round ``index`` (0-based, warm-ups included), and which slots
        to drop first. ``wide()``: (name, ratio) of configurations whose interval is
        wider than the target (bootstrapped only once the planned rounds are done);
        ``slow_first()``: (name, slot, seconds of its last run) of droppable
        configurations, the slowest first (asked only when not even one round fits
        before any timed one ran).

        Behind the budget, the warm-ups left are cut first, then the planned timed
        rounds (as each stops fitting), and only then configurations.
        """
        planned = self.warmup + self.repeat
        if index < planned and self.deadline is not None and index > 0 and not self.fits(planned - index):
            if index < self.warmup:
                self.notes.append(f"batch {self.batch}: behind the time budget: {self.warmup - index} warm-up round(s) "
                                  "left out")
                self.warmup = index
                planned = self.warmup + self.repeat
            timed = index - self.warmup  # timed rounds done so far
            if not self.fits(1):
                if timed > 0:
                    self.notes.append(f"batch {self.batch}: behind the time budget: {planned - index} of {self.repeat} "
                                      f"planned timed round(s) dropped after {timed}")
                    return False, []
                dropped = []
                for name, slot, seconds in slow_first()[:-1]:  # one configuration beside fp32 stays
                    if self.fits(1):
                        break
                    dropped.append(slot)
                    self._last = max(0.0, self._last - seconds)
                    self.notes.append(f"batch {self.batch}: behind the time budget: dropped {name} before its first "
                                      "timed run")
                return True, dropped
            return True, []
        timed = index - self.warmup
        if index < planned:
            return True, []
        wide = wide()
        if not wide:
            return False, []
        if index < planned + self.extra and self.fits(1):
            return True, []
        undecided = [(name, ratio) for name, ratio in wide if ratio.verdict() == "undecided"]
        if not undecided:
            return False, []
        names = few(undecided, show=lambda item: f"{item[0]} {item[1].text()}")
        self.notes.append(f"batch {self.batch}: undecided after {max(timed, 0)} timed rounds (interval wider than "
                          f"{100 * TARGET_WIDTH:.0f} %, faster or slower than fp32 not supported): {names}; "
                          "re-run on a quiet machine or raise --repeat/--budget")
        return False, []

    def adaptive_note(self, index: int) -> None:
        added = index - (self.warmup + self.repeat)
        if added > 0:
            self.notes.append(f"batch {self.batch}: {added} round(s) added to narrow the speed ratios' 95% intervals, within the budget")
