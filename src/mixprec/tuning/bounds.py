"""Quality bounds and the metrics they read: :class:`Bound`, :func:`parse_bound` and
:func:`tightened` (the margin the search works to).

:func:`worst_case` combines per-seed quality dicts metric by metric, in each metric's own
direction.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

from mixprec._quote import quote

__all__ = ["LOWER_IS_BETTER", "METRICS", "OPS", "DEFAULT_MARGIN_DB", "Bound", "parse_bound", "tightened", "worst_case"]


#: Quality metrics where a smaller value is better; every other metric is higher-better.
LOWER_IS_BETTER: frozenset[str] = frozenset({"max_abs_err", "rel_err", "lsd_db", "nonfinite"})


def _worse(metric: str, a: float, b: float) -> float:
    if isinstance(a, float) and math.isnan(a):
        return a
    if isinstance(b, float) and math.isnan(b):
        return b
    return max(a, b) if metric in LOWER_IS_BETTER else min(a, b)


def worst_case(per_seed: Sequence[dict[str, float]]) -> dict[str, float]:
    """Combine per-seed quality dicts: min of higher-better metrics, max of lower-better ones (nan wins)."""
    out: dict[str, float] = {}
    for quality in per_seed:
        for key, value in quality.items():
            if value is None:
                continue
            value = float(value)
            out[key] = value if key not in out else _worse(key, out[key], value)
    return out


#: Bound metric name -> quality key it reads.
METRICS: dict[str, str] = {
    "sqnr": "sqnr_db", "snr": "snr_db", "psnr": "psnr_db", "cosine": "cosine", "rel_err": "rel_err",
    "max_abs_err": "max_abs_err", "ssim": "ssim", "token_agreement": "token_agreement",
    "step_sqnr": "step_sqnr_db",
}


#: The comparisons a bound may use.
OPS: tuple[str, ...] = (">=", ">", "<=", "<")

_GRAMMAR = f"'<metric> <op> <number>' with op one of {', '.join(OPS)}"
_BOUND_RE = re.compile(r"^\s*([a-z_]+)\s*(" + "|".join(sorted(OPS, key=len, reverse=True)) + r")\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


@dataclass(frozen=True)
class Bound:
    """A quality bound such as ``sqnr >= 30``.

    Attributes:
        metric: one of :data:`METRICS`.
        op: ``>=``, ``>``, ``<=`` or ``<``.
        value: the threshold.
    """

    metric: str
    op: str
    value: float

    @property
    def key(self) -> str:
        """The quality-dict key the bound reads (``sqnr`` -> ``sqnr_db``)."""
        return METRICS[self.metric]

    @property
    def higher_is_better(self) -> bool:
        return self.op in (">=", ">")

    def met(self, quality: dict[str, float]) -> bool:
        """Whether ``quality`` satisfies the bound (a missing or nan value does not)."""
        v = quality.get(self.key)
        if v is None or math.isnan(v):
            return False
        return {">=": v >= self.value, ">": v > self.value, "<=": v <= self.value, "<": v < self.value}[self.op]

    def miss(self, quality: dict[str, float]) -> float:
        """How far ``quality`` is from the threshold on the wrong side (0 at or past it; inf if unknown)."""
        v = quality.get(self.key)
        if v is None or math.isnan(v):
            return math.inf
        return max(0.0, self.value - v) if self.higher_is_better else max(0.0, v - self.value)

    def score(self, quality: dict[str, float]) -> float:
        """The bound's metric oriented so that larger is better (nan/missing -> -inf)."""
        v = quality.get(self.key)
        if v is None or math.isnan(v):
            return -math.inf
        return v if self.higher_is_better else -v

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def parse_bound(text: str | Bound) -> Bound:
    """Parse ``"sqnr>=30"`` into a :class:`Bound`.

    Raises:
        ValueError: text that does not follow the grammar, or an unknown metric; the
            message repeats the text, the grammar and the valid metrics.
    """
    if isinstance(text, Bound):
        return text
    valid = ", ".join(METRICS)
    match = _BOUND_RE.match(text.strip().lower()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"cannot parse bound {quote(text)}: expected {_GRAMMAR}, e.g. 'sqnr>=30'; metrics: {valid}")
    metric, op, number = match.groups()
    if metric not in METRICS:
        raise ValueError(f"bound {quote(text)}: unknown metric {quote(metric)}; expected {_GRAMMAR}; metrics: {valid}")
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"bound {quote(text)}: {quote(number)} is not a finite number (1e999 overflows to infinity); give a finite threshold")
    return Bound(metric, op, value)


#: Metrics in dB, metrics that are error amplitudes, and scores in [0, 1] whose shortfall
#: from 1 behaves like an error power: how a margin in dB moves each one's threshold.
_DB_METRICS = frozenset({"sqnr", "snr", "psnr", "step_sqnr"})
_AMPLITUDE_METRICS = frozenset({"rel_err", "max_abs_err"})

#: The search's default margin: it looks for 1 dB less error than the bound allows.
DEFAULT_MARGIN_DB = 1.0


def tightened(bound: Bound, margin_db: float) -> Bound:
    """The bound the search works to: ``margin_db`` dB less error than ``bound`` allows.

    A dB metric moves by the margin (``sqnr>=40``, 1 dB: ``sqnr>=41``); an error
    amplitude by the factor ``10**(-margin/20)`` (``rel_err<=0.01``: ``<=0.00891``);
    a score in [0, 1] has its shortfall from 1 scaled by ``10**(-margin/10)``
    (``cosine>=0.99``: ``>=0.99206``), so the threshold never passes 1.

    Examples:
        >>> str(tightened(parse_bound("sqnr>=40"), 1.0))
        'sqnr>=41'
    """
    if not math.isfinite(margin_db) or margin_db < 0:
        raise ValueError(f"margin {quote(margin_db)}: expected a finite number of dB >= 0 (0: no margin)")
    if margin_db == 0:
        return bound
    sign = 1.0 if bound.higher_is_better else -1.0  # the direction of "less error"
    if bound.metric in _DB_METRICS:
        value = bound.value + sign * margin_db
    elif bound.metric in _AMPLITUDE_METRICS:
        value = bound.value * 10 ** (sign * margin_db / 20)
    else:
        value = 1.0 - (1.0 - bound.value) * 10 ** (-sign * margin_db / 10)
    return Bound(bound.metric, bound.op, float(f"{value:.6g}"))
