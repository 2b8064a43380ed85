"""The final check of a latency search: the :func:`finalists` re-timed side by side
(:func:`retime`), and :func:`pick_final`, which replaces a known answer only with a finalist
whose paired interval says it is faster.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from typing import Any, Callable, Sequence

from mixprec.measure.stats import paired_ratio
from mixprec.tuning.candidates import Candidate
from mixprec.tuning.policies import STEP_PREFIX
from mixprec.tuning.search import Search

__all__ = ["finalists", "pick_final", "retime"]


def finalists(search: Search, limit: int = 3) -> list[Candidate]:
    """The ``limit`` cheapest distinct candidates meeting the bound, plus the cheapest preset meeting it.

    The fp32 baseline (the path's first candidate) is added when it meets the bound, so
    the result's speed relative to fp32 comes from the same side-by-side rounds.
    """
    seen: set[str] = set()
    ranked = []
    for cand in sorted((c for c in search.path if c.met), key=search.cost):
        key = json.dumps(dataclasses.replace(cand.policy, name="candidate").to_dict(), sort_keys=True)
        if key not in seen:
            seen.add(key)
            ranked.append(cand)
    chosen = ranked[:limit]
    preset = next((c for c in ranked if c.step.startswith(("preset ", STEP_PREFIX))), None)
    if preset is not None and preset not in chosen:
        chosen.append(preset)
    baseline = search.path[0] if search.path else None
    if baseline is not None and baseline.met and baseline not in chosen:
        chosen.append(baseline)
    return chosen


def retime(evaluator: Any, candidates: Sequence[Candidate], rounds: int, *,
           after: Callable[[], None] | None = None) -> dict[int, list[float]]:
    """Time ``candidates`` side by side: one untimed round, then ``rounds`` interleaved timed rounds
    (``after`` is called after each run, for progress).

    Returns candidate index -> seconds per round. The search's own medians each come
    from a different moment of a shared machine; interleaving puts the finalists
    under the same load, so the smallest median here is the fairest winner.
    """
    samples: dict[int, list[float]] = {c.index: [] for c in candidates}
    for round_index in range(rounds + 1):
        for cand in candidates:
            seconds = evaluator.time(cand.policy, 1)
            if round_index > 0:
                samples[cand.index] += seconds
            if after is not None:
                after()
    return samples


def pick_final(final: dict[int, list[float]], known: Sequence[int] = (), *, margin: float = 0.0) -> tuple[int, str]:
    """The winner of the side-by-side re-timing, and why.

    Every comparison is paired: round ``r`` of two finalists ran under the same load, so
    each round gives one speed ratio, and a difference counts only where the interval
    of those ratios (:func:`mixprec.measure.stats.paired_ratio`) lies beyond ``margin``
    (a fraction). The incumbent is the fp32 baseline (index 0) when it is a finalist,
    replaced by a known answer (a preset) only where that one is supported faster; then
    any other finalist replaces the incumbent only where it is supported faster. A
    comparison the rounds cannot decide keeps the safer configuration and says
    "undecided on this machine".

    Args:
        final: candidate index -> seconds per round (same rounds, same order).
        known: the indices in ``final`` that are presets or the fp32 baseline.
        margin: the relative gain a challenger's whole interval must show.

    Examples:
        >>> pick_final({1: [1.0, 1.0, 1.0], 2: [0.9, 1.1, 0.9]}, known=[1])[0]
        1
    """
    if not final:
        raise ValueError("no finalists to choose from")
    median = {i: statistics.median(v) for i, v in final.items()}
    undecided: list[str] = []

    def beats(challenger: int, incumbent: int) -> bool:
        ratio = paired_ratio(final[incumbent], final[challenger])
        verdict = ratio.verdict(1.0, margin)
        if verdict == "undecided" and median[challenger] < median[incumbent]:
            undecided.append(f"#{challenger} vs #{incumbent} {ratio.text()}")
        return verdict == "above"

    pool = [i for i in final if i in known] or list(final)
    incumbent = 0 if 0 in pool else min(pool, key=median.get)
    for challenger in sorted((i for i in pool if i != incumbent), key=median.get):
        if beats(challenger, incumbent):
            incumbent = challenger
            break
    winner = incumbent
    for challenger in sorted((i for i in final if i not in pool), key=median.get):
        if median[challenger] < median[winner] and beats(challenger, winner):
            winner = challenger
            break
    doubt = f"; undecided on this machine: {', '.join(undecided)} (interval holds 1), the safer kept" if undecided else ""
    if winner == incumbent:
        return winner, f"#{winner} kept: no finalist was supported faster" + (f" by more than {margin:.0%}" if margin else "") + doubt
    ratio = paired_ratio(final[incumbent], final[winner])
    return winner, (f"#{winner} chosen: {ratio.text()} the speed of #{incumbent} over {ratio.n} paired rounds "
                    f"({median[winner] * 1e3:.1f} vs {median[incumbent] * 1e3:.1f} ms median){doubt}")
