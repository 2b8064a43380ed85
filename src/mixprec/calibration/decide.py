"""Which candidate a calibration keeps, from paired rounds: the rule-based choice stays unless
another candidate is supported faster.

Each round timed every candidate once, one after the other, so round ``i`` of two
candidates ran under the same conditions and gives one ratio;
:func:`~mixprec.measure.stats.paired_ratio` summarises a pair's ratios by their median and
a confidence interval. Against the incumbent (the rule-based resolution, or the untouched
model where the rules' choice fell out), a challenger is

* ``faster``: the whole interval above 1 (supported faster);
* ``slower``: the whole interval below 1;
* ``no gain``: the interval holds 1 and reaches no higher than ``1 + margin``;
* ``undecided``: the interval holds 1 and reaches past ``1 + margin``.

The winner is the faster challenger with the highest median ratio (the incumbent where
none is faster). The measurement is settled when no other candidate may still beat the
winner by the margin: every one's paired interval against the winner reaches no higher
than ``1 + margin``. Nothing undecided is ever called a winner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from mixprec.measure.stats import Ratio, paired_ratio

__all__ = ["Verdicts", "compare", "MARGIN", "MIN_ROUNDS"]

#: A candidate whose interval against the kept one reaches past this gain keeps the comparison open.
MARGIN = 0.02
#: Paired rounds needed before any verdict (a bootstrap interval needs five).
MIN_ROUNDS = 5


@dataclass(frozen=True)
class Verdicts:
    """The comparison of every challenger with the incumbent.

    Attributes:
        incumbent: the label that stays unless beaten.
        ratios: challenger -> its speed over the incumbent's (above 1: faster).
        status: challenger -> ``faster`` / ``slower`` / ``no gain`` / ``undecided``.
        winner: the label kept.
        contenders: candidates whose paired interval against the winner still reaches
            beyond the margin (one of them may be the faster).
    """

    incumbent: str
    ratios: dict[str, Ratio]
    status: dict[str, str]
    winner: str
    contenders: tuple[str, ...] = ()

    @property
    def settled(self) -> bool:
        return not self.contenders

    def undecided(self) -> list[str]:
        return [label for label, s in self.status.items() if s == "undecided"]


def _status(ratio: Ratio, margin: float, rounds: int) -> str:
    if rounds < MIN_ROUNDS or ratio.n < MIN_ROUNDS:
        return "undecided"
    if ratio.low > 1:
        return "faster"
    if ratio.high < 1:
        return "slower"
    if ratio.high <= 1 + margin:
        return "no gain"
    return "undecided"


def compare(samples: Mapping[str, Sequence[float]], incumbent: str, challengers: Sequence[str], *,
            margin: float = MARGIN, quality: Mapping[str, float] | None = None) -> Verdicts:
    """Each challenger against ``incumbent`` over their paired rounds (``samples``: label ->
    seconds per round, the same rounds in the same order), and the winner (of equal medians,
    the one listed later in ``challengers``). With ``quality`` (label -> output SQNR, higher is
    better), a faster challenger the rounds cannot tell from the fastest (its paired interval
    against it reaches 1) wins over it where its quality is higher: as fast, and more exact.

    Examples:
        >>> compare({"rules": [1.0] * 5, "naive-bf16": [0.5] * 5}, "rules", ["naive-bf16"]).winner
        'naive-bf16'
    """
    base = list(samples[incumbent])
    ratios, status = {}, {}
    for label in challengers:
        if label == incumbent:
            continue
        ratio = paired_ratio(base, list(samples[label]))
        ratios[label], status[label] = ratio, _status(ratio, margin, min(len(base), len(samples[label])))
    faster = [label for label in ratios if status[label] == "faster"]
    # Equal medians: the later challenger wins (callers list the simplest change, the untouched model, last).
    order = {label: i for i, label in enumerate(ratios)}
    winner = max(faster, key=lambda label: (ratios[label].value, order[label])) if faster else incumbent
    if faster and quality:
        alike = [label for label in faster if label == winner
                 or paired_ratio(list(samples[winner]), list(samples[label])).high >= 1.0]
        winner = max(alike, key=lambda label: (quality.get(label, -math.inf), label == winner, order[label]))
    rounds = min(len(v) for v in samples.values()) if samples else 0
    contenders = tuple(label for label in [incumbent, *ratios] if label != winner and (
        rounds < MIN_ROUNDS or paired_ratio(list(samples[winner]), list(samples[label])).high > 1 + margin))
    return Verdicts(incumbent, ratios, status, winner, contenders)
