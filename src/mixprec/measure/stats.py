"""Paired timing statistics: speed ratios with confidence intervals, and instability.

On a busy machine two medians taken minutes apart can differ by 5x for the same
code. What holds up is pairing: a configuration and its fp32 reference are timed
alternately, round after round, so each round gives one ratio measured under the same
conditions. :func:`paired_ratio` summarises those per-round ratios by their median and
a bootstrap confidence interval (:func:`scipy.stats.bootstrap`, percentile method);
every decision (faster or not, which candidate wins, whether a change is beyond noise)
is made on that interval with :meth:`Ratio.verdict`, and an interval that straddles
the threshold is said as "undecided", never as a winner.

:func:`instability` says out loud, as pyperf does, when the samples are too spread
(coefficient of variation) or the rounds ran at another speed than the calibration.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

__all__ = ["Ratio", "paired_ratio", "cv", "instability", "CV_LIMIT", "DRIFT_LIMIT", "TARGET_WIDTH", "MIN_INTERVAL_PAIRS",
           "memory_beyond_noise", "MEMORY_FLOOR_BYTES"]

#: A spread of samples beyond this coefficient of variation is reported as unstable
#: (pyperf warns above 10 %; a shared 2-core runner often sits between 5 and 10 %).
CV_LIMIT = 0.10
#: Rounds whose median differs from the calibration run by more than this factor.
DRIFT_LIMIT = 2.0
#: Adaptive rounds stop once every ratio's interval is narrower than this (relative:
#: (high - low) / ratio).
TARGET_WIDTH = 0.10
#: Memory readings (RSS, allocator peaks) move by a few MiB between identical runs.
MEMORY_FLOOR_BYTES = 8 * 2**20
#: Fewer pairs than this get no bootstrap interval of their median ratio: only their range.
MIN_INTERVAL_PAIRS = 5


@dataclass(frozen=True)
class Ratio:
    """A speed ratio from paired rounds: ``value`` (median of the per-round ratios) and
    its ``confidence`` interval ``[low, high]`` over ``n`` rounds. ``exact`` is False
    where there were too few rounds for a bootstrap (the interval is then the range)."""

    value: float
    low: float
    high: float
    n: int
    confidence: float = 0.95
    exact: bool = True

    @property
    def width(self) -> float:
        """Relative width of the interval: ``(high - low) / value``."""
        return (self.high - self.low) / self.value if self.value and math.isfinite(self.value) else math.inf

    def verdict(self, threshold: float = 1.0, margin: float = 0.0) -> str:
        """``"above"`` where the whole interval is above ``threshold * (1 + margin)``,
        ``"below"`` where it is below ``threshold / (1 + margin)``, else ``"undecided"``."""
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.n < 3:
            return "undecided"
        if self.low > threshold * (1 + margin):
            return "above"
        if self.high < threshold / (1 + margin):
            return "below"
        return "undecided"

    def text(self, unit: str = "x") -> str:
        """``1.42x (1.31-1.55)``; ``(range)`` instead of an interval where ``exact`` is False."""
        return f"{self.value:.2f}{unit} ({self.low:.2f}-{self.high:.2f}{'' if self.exact else ', range'})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def paired_ratio(reference: Sequence[float], candidate: Sequence[float], *, confidence: float = 0.95,
                 resamples: int = 2000, seed: int = 0) -> Ratio:
    """The speed of ``candidate`` relative to ``reference`` from paired samples.

    ``reference[i]`` and ``candidate[i]`` are the seconds of round ``i`` (timed one after
    the other); each round gives ``reference[i] / candidate[i]`` (above 1: the candidate
    is faster). The result is the median of those ratios with a percentile bootstrap
    interval of the median. Unpaired trailing samples are dropped.

    Raises:
        ValueError: no pair, or a sample that is not a positive finite number.
    """
    n = min(len(reference), len(candidate))
    if n == 0:
        raise ValueError("paired_ratio needs at least one pair of samples")
    ref = np.asarray(reference[:n], dtype=np.float64)
    cand = np.asarray(candidate[:n], dtype=np.float64)
    for name, values in (("reference", ref), ("candidate", cand)):
        if not (np.isfinite(values).all() and (values > 0).all()):
            raise ValueError(f"{name} samples must be positive and finite, got {values.tolist()}")
    ratios = ref / cand
    value = float(np.median(ratios))
    if n < MIN_INTERVAL_PAIRS or np.ptp(ratios) == 0:
        return Ratio(value, float(ratios.min()), float(ratios.max()), n, confidence, exact=n >= MIN_INTERVAL_PAIRS)
    from scipy.stats import bootstrap

    result = bootstrap((ratios,), np.median, confidence_level=confidence, n_resamples=resamples, method="percentile",
                       rng=np.random.default_rng(seed), vectorized=True, axis=-1)
    low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
    return Ratio(value, min(low, value), max(high, value), n, confidence)


def cv(samples: Sequence[float]) -> float | None:
    """Coefficient of variation (sample standard deviation over mean); None below two samples."""
    values = np.asarray([float(x) for x in samples], dtype=np.float64)
    if values.size < 2 or values.mean() <= 0:
        return None
    return float(values.std(ddof=1) / values.mean())


def instability(samples: Sequence[float], *, calibration: float | None = None, cv_limit: float = CV_LIMIT,
                drift_limit: float = DRIFT_LIMIT) -> str | None:
    """Why these timings cannot be trusted as they are, or None when they look stable.

    Two signs, as pyperf checks them: a coefficient of variation (standard deviation over
    mean) above ``cv_limit``, and rounds whose median is more than ``drift_limit`` times
    slower than the ``calibration`` run (the first run, which planned the rest).
    """
    values = np.asarray([float(s) for s in samples], dtype=np.float64)
    reasons = []
    spread = cv(values)
    if spread is not None and spread > cv_limit:
        reasons.append(f"CV {100 * spread:.0f} %")
    if calibration and values.size:
        median = float(np.median(values))
        # Only slower: a first run is often slower than later ones (lazy set-up), and
        # rounds much slower than it mean the machine got busy after it.
        if median > drift_limit * calibration:
            reasons.append(f"calibration {calibration:.3g} s vs {values.min():.3g} to {values.max():.3g} s in rounds")
    return ", ".join(reasons) or None


def memory_beyond_noise(base: float, new: float, max_increase: float, *, floor_bytes: float = MEMORY_FLOOR_BYTES) -> bool:
    """Whether ``new`` bytes exceed ``base`` by more than ``max_increase`` (a fraction)
    and by more than the noise floor of memory readings (``floor_bytes``)."""
    return new - base > max(max_increase * base, floor_bytes)
