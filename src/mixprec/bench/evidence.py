"""What a run's stored timings support, and what they do not.

Two runs taken minutes apart on a busy machine can differ by several times for the same
code, while within one run each round times the fp32 reference and then every
configuration, one after the other. So every decision about speed rests on intervals:

- :func:`speedup`: a configuration's speed against its own run's fp32 reference at the
  same batch, from paired rounds (the ``speedup``, ``speedup_ci_low``,
  ``speedup_ci_high`` and ``speedup_pairs`` metrics the runner stores, or, for runs
  stored without them, :func:`mixprec.measure.stats.paired_ratio` over the stored
  samples paired by round);
- :func:`latency`: the median latency and its distribution-free 95 % interval
  (:func:`mixprec.measure.metrics.latency_stats`);
- :func:`change`: whether two such intervals say a change (they do not overlap), say
  none within the noise (they overlap and both are narrow), or cannot say;
- :func:`regression`: whether an interval pair supports a slow-down beyond an allowed
  fraction, excludes one, or leaves it undecided (the gate's latency check).

An interval from fewer than two samples (or pairs) supports nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from mixprec.bench import rundata
from mixprec.measure.metrics import latency_stats
from mixprec.measure.stats import TARGET_WIDTH, paired_ratio

__all__ = ["Interval", "REFERENCE", "reference", "ratio_text", "speedup", "speedup_cell", "MIN_PAIRS", "latency", "change", "regression", "FASTER", "SLOWER",
           "WITHIN_NOISE", "UNDECIDED", "OTHER_DEVICE"]

#: The configuration every other one in a run is timed against.
REFERENCE = "fp32"

FASTER, SLOWER, WITHIN_NOISE, UNDECIDED = "faster", "slower", "within noise", "undecided on this machine"
#: The latency verdict of two runs measured on different devices (a CPU run and a CUDA run):
#: their seconds time two devices, not one code change.
OTHER_DEVICE = "not compared: other device"


@dataclass(frozen=True)
class Interval:
    """A measured value and its 95 % interval ``[low, high]`` from ``n`` samples or
    pairs (``None``: not known, an interval stored without its samples). ``exact`` is
    False where there were too few samples for 95 % (the interval is then their range)."""

    value: float
    low: float
    high: float
    n: int | None
    exact: bool = True

    @property
    def usable(self) -> bool:
        """Whether it can support a decision: finite bounds from at least two samples."""
        finite = all(math.isfinite(x) for x in (self.value, self.low, self.high))
        return finite and (self.n is None or self.n >= 2)

    @property
    def width(self) -> float:
        """Relative width, ``(high - low) / value``."""
        return (self.high - self.low) / abs(self.value) if self.value and math.isfinite(self.value) else math.inf

    def text(self, unit: str = "x") -> str:
        """``1.42x (1.31-1.55x)``; ``, range`` where the interval is the samples' range."""
        if self.n == 0:
            return f"{ratio_text(self.value)}{unit} (no interval)"
        note = "" if self.exact else ", range"
        return f"{ratio_text(self.value)}{unit} ({ratio_text(self.low)}-{ratio_text(self.high)}{unit}{note})"

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n, "exact": self.exact}


def ratio_text(value: float) -> str:
    """A ratio with two decimals, or two significant digits below 0.1 (``0.068``, not ``0.07``)."""
    return f"{value:.2f}" if not math.isfinite(value) or value == 0 or abs(value) >= 0.1 else f"{value:.2g}"


#: Fewer paired rounds than this support no speed-up (a ratio from one or two rounds is a sample, not a result).
MIN_PAIRS = 3


def speedup_cell(interval: Interval | None, *, unstable: bool = False, reference: bool = False) -> str:
    """A speed-up against fp32 as every table shows it (terminal, HTML report, web UI, ``compare``):
    a figure only where its interval supports one.

    - ``1.42x (1.31–1.55)``: at least :data:`MIN_PAIRS` paired rounds whose interval lies wholly
      above 1 (faster) or below 1 (slower);
    - ``undecided (0.90–1.07)``: the interval holds 1, so neither faster nor slower is supported;
    - ``undecided (n=1)``: too few paired rounds for an interval;
    - ``undecided (no interval)``: a ratio stored without an interval or samples;
    - ``unstable (0.52–3.10)``: the timings were flagged too spread to trust (the run's notes say why);
    - ``reference``: the fp32 reference itself; ``—``: nothing was timed.

    Only the first form shows a ratio alone, so no cell can be read as a speed-up its
    interval does not support.
    """
    if reference:
        return "reference"
    if interval is None or not math.isfinite(interval.value):
        return "—"
    bounds = f"{ratio_text(interval.low)}–{ratio_text(interval.high)}"
    if interval.n == 0:
        return "undecided (no interval)"
    if interval.n is not None and interval.n < MIN_PAIRS:
        return f"undecided (n={interval.n})"
    if not interval.usable:
        return "undecided (no interval)"
    if unstable:
        return f"unstable ({bounds})"
    if interval.low <= 1.0 <= interval.high:
        return f"undecided ({bounds})"
    return f"{ratio_text(interval.value)}x ({bounds})"


def _make(value: float, low: float, high: float, n: int | None, exact: bool) -> Interval:
    # The value always lies inside its interval, whatever was stored.
    return Interval(value, min(low, value), max(high, value), n, exact)


def reference(run: Mapping[str, Any], batch: Any) -> Mapping[str, Any] | None:
    """The fp32 reference of ``run`` at ``batch``: the configuration named ``fp32``, else
    the batch's first configuration (the one the runner timed first)."""
    group = rundata.group(run, batch)
    return next((c for c in group if c.get("name") == REFERENCE), group[0] if group else None)


def _timed(config: Mapping[str, Any]) -> dict[int, float]:
    """Round index -> seconds; samples stored without their rounds are rounds 0, 1, ..."""
    samples = list(config.get("samples") or [])
    rounds = config.get("rounds")
    rounds = list(rounds) if rounds is not None and len(rounds) == len(samples) else range(len(samples))
    out = {}
    for index, value in zip(rounds, samples):
        seconds = rundata.num(value)
        if seconds is not None and math.isfinite(seconds) and seconds > 0:
            out[int(index)] = seconds
    return out


def speedup(run: Mapping[str, Any], config: Mapping[str, Any]) -> Interval | None:
    """How much faster ``config`` ran than its run's fp32 reference, from paired rounds.

    The stored ``speedup`` interval where the run has one; else the median per-round
    ratio and its bootstrap interval over the samples paired by round; else a stored
    ``speedup`` alone (``n`` 0: no interval); ``None`` when nothing was timed.
    """
    metrics = rundata.metrics(config)
    value, low, high = (rundata.num(metrics.get(k)) for k in ("speedup", "speedup_ci_low", "speedup_ci_high"))
    if value is not None and low is not None and high is not None:
        n = rundata.num(metrics.get("speedup_pairs"))
        pairs = int(n) if n is not None and math.isfinite(n) else None
        return _make(value, low, high, pairs, pairs is not None and pairs >= 5)
    ref = reference(run, config.get("batch"))
    if ref is not None:
        base, own = _timed(ref), _timed(config)
        rounds = [r for r in own if r in base]
        if rounds:
            ratio = paired_ratio([base[r] for r in rounds], [own[r] for r in rounds])
            return _make(ratio.value, ratio.low, ratio.high, ratio.n, ratio.exact)
    if value is not None and math.isfinite(value):
        return Interval(value, value, value, 0, False)
    return None


def latency(config: Mapping[str, Any]) -> Interval | None:
    """The median latency (seconds) and its 95 % interval; ``None`` where it was not measured."""
    stats = rundata.latency(config)
    if stats is None:
        return None
    median, low, high = stats["median"], stats.get("ci_low"), stats.get("ci_high")
    samples = [s for s in (rundata.num(x) for x in config.get("samples") or []) if s is not None and math.isfinite(s)]
    n = len(samples) if samples else None
    if (low is None or high is None) and samples:
        computed = latency_stats(samples)
        low, high, stats = computed["ci_low"], computed["ci_high"], {"ci_exact": computed["ci_exact"]}
    if low is None or high is None:
        return Interval(median, median, median, 0, False)
    exact = stats.get("ci_exact")
    return _make(median, low, high, n, True if exact is None else bool(exact))


def change(before: Interval | None, after: Interval | None, *, more: str = SLOWER, less: str = FASTER) -> str | None:
    """What two intervals of one quantity support about its change from ``before`` to ``after``.

    ``more`` / ``less`` where the intervals do not overlap (the whole of ``after`` above
    or below the whole of ``before``); :data:`WITHIN_NOISE` where they overlap and both
    are narrower than :data:`~mixprec.measure.stats.TARGET_WIDTH` (any change is smaller
    than that); :data:`UNDECIDED` otherwise (one is too wide, or from too few samples, to
    tell). ``None`` where either is missing.
    """
    if before is None or after is None:
        return None
    if not (before.usable and after.usable):
        return UNDECIDED
    if after.low > before.high:
        return more
    if after.high < before.low:
        return less
    if before.width <= TARGET_WIDTH and after.width <= TARGET_WIDTH:
        return WITHIN_NOISE
    return UNDECIDED


def regression(before: Interval | None, after: Interval | None, allowed: float, *, higher_is_slower: bool) -> str | None:
    """Whether ``after`` is slower than ``before`` by more than ``allowed`` (a fraction).

    For latencies (``higher_is_slower``) a regression is supported where the whole of
    ``after`` lies above ``before``'s interval times ``1 + allowed``; for speed-ups where
    the whole of ``after`` times ``1 + allowed`` lies below ``before``'s interval.
    Returns ``"regression"``, ``"ok"`` (the intervals exclude a regression beyond
    ``allowed``), ``"undecided"``, or ``None`` where either is missing.
    """
    if before is None or after is None:
        return None
    if not (before.usable and after.usable):
        return "undecided"
    factor = 1.0 + allowed
    if higher_is_slower:
        if after.low > before.high * factor:
            return "regression"
        if after.high <= before.low * factor:
            return "ok"
    else:
        if after.high * factor < before.low:
            return "regression"
        if after.low * factor >= before.high:
            return "ok"
    return "undecided"
