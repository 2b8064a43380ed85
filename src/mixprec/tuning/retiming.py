"""The final check of a latency search: the :func:`finalists` re-timed side by side
(:func:`retime`), and :func:`pick_final`, which replaces a known answer only with a finalist
faster in every round.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from typing import Any, Sequence

from mixprec.tuning.candidates import Candidate
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
    preset = next((c for c in ranked if c.step.startswith("preset ")), None)
    if preset is not None and preset not in chosen:
        chosen.append(preset)
    baseline = search.path[0] if search.path else None
    if baseline is not None and baseline.met and baseline not in chosen:
        chosen.append(baseline)
    return chosen


def retime(evaluator: Any, candidates: Sequence[Candidate], rounds: int) -> dict[int, list[float]]:
    """Time ``candidates`` side by side: one untimed round, then ``rounds`` interleaved timed rounds.

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
    return samples


def pick_final(final: dict[int, list[float]], known: Sequence[int] = (), *, margin: float = 0.0) -> tuple[int, str]:
    """The winner of the side-by-side re-timing, and why.

    The incumbent is the fastest (by median) of the ``known`` answers among the
    finalists (the presets and the fp32 baseline), else the fastest finalist. Another
    finalist replaces it only when it was faster in every interleaved round (a paired
    comparison under the same load) and its median is lower by more than ``margin``
    (a fraction), so a difference within the machine's noise never replaces a known
    setting with another policy.

    Args:
        final: candidate index -> seconds per round (same rounds, same order).
        known: the indices in ``final`` that are presets or the fp32 baseline.
        margin: the relative median gain a challenger must show.

    Example:
        >>> pick_final({1: [1.0, 1.0, 1.0], 2: [0.9, 1.1, 0.9]}, known=[1])
        (1, '#1 kept: no finalist was faster in every round')
    """
    if not final:
        raise ValueError("no finalists to choose from")
    median = {i: statistics.median(v) for i, v in final.items()}
    pool = [i for i in final if i in known] or list(final)
    incumbent = min(pool, key=median.get)
    rounds = final[incumbent]
    clearly = [i for i in final if i != incumbent and len(final[i]) == len(rounds) and rounds
               and all(a < b for a, b in zip(final[i], rounds)) and median[i] < median[incumbent] * (1 - margin)]
    if not clearly:
        return incumbent, (f"#{incumbent} kept: no finalist was faster in every round"
                           + (f" and by more than {margin:.0%}" if margin else ""))
    winner = min(clearly, key=median.get)
    return winner, (f"#{winner} chosen: faster than #{incumbent} in all {len(rounds)} rounds "
                    f"({median[winner] * 1e3:.1f} vs {median[incumbent] * 1e3:.1f} ms median)")
