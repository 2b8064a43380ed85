"""Held-out validation of the chosen policy: the validation seeds
(:func:`validation_seed_list`), the check that steps along the frontier while the policy
misses them (:func:`validate_held_out`), and the per-metric :func:`seed_summary`.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

from mixprec._quote import quote
from mixprec.tuning.bounds import Bound, worst_case
from mixprec.tuning.candidates import Candidate, frontier
from mixprec.tuning.search import Search

__all__ = ["MAX_VALIDATION_TRIES", "seed_summary", "validate_held_out", "validation_seed_list"]


def validation_seed_list(spec: int | Sequence[int], search_seeds: Sequence[int]) -> tuple[int, ...]:
    """The validation seeds: ``spec`` seeds after the search seeds, or the seeds ``spec`` lists.

    Raises:
        ValueError: a negative count or seed, or seeds shared with the search (both lists named).
    """
    search = [int(s) for s in search_seeds]
    if isinstance(spec, bool):
        raise ValueError(f"validation seeds {quote(spec)}: expected a count >= 0 or a list of seeds")
    if isinstance(spec, int):
        if spec < 0:
            raise ValueError(f"validation seeds {spec}: expected a count >= 0 (0 disables validation) or a list of seeds")
        start = max(search, default=-1) + 1
        return tuple(range(start, start + spec))
    seeds = tuple(dict.fromkeys(int(s) for s in spec))
    if any(s < 0 for s in seeds):
        raise ValueError(f"validation seeds {list(seeds)}: seeds must be >= 0")
    shared = sorted(set(seeds) & set(search))
    if shared:
        raise ValueError(f"validation seeds {list(seeds)} overlap the search seeds {search} (both hold "
                         f"{', '.join(map(str, shared))}): validation must use inputs the search never saw")
    return seeds


def seed_summary(per_seed: dict[int, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per quality metric over the seeds: ``worst``, ``median``, ``spread`` (max - min), ``seeds``.

    Examples:
        >>> seed_summary({0: {"sqnr_db": 41.0}, 1: {"sqnr_db": 43.0}, 2: {"sqnr_db": 42.5}})
        {'sqnr_db': {'worst': 41.0, 'median': 42.5, 'spread': 2.0, 'seeds': 3}}
    """
    keys = dict.fromkeys(k for q in per_seed.values() for k in q)
    out: dict[str, dict[str, float]] = {}
    for key in keys:
        values = [float(q[key]) for q in per_seed.values() if q.get(key) is not None]
        if not values:
            continue
        worst = worst_case([{key: v} for v in values])[key]
        high, low = max(values), min(values)
        spread = 0.0 if high == low else high - low  # inf - inf (every seed exact) is no spread
        out[key] = {"worst": worst, "median": statistics.median(values), "spread": spread, "seeds": len(values)}
    return out


#: Policies tried on the validation seeds before falling back to the fp32 baseline.
MAX_VALIDATION_TRIES = 4


def _fallbacks(search: Search, failed: Candidate) -> list[Candidate]:
    """What to validate after ``failed`` misses: frontier candidates meeting the search bound
    with more quality on the search seeds than ``failed``, cheapest first; then the baseline."""
    score = search.bound.score(failed.evaluation.quality)
    better = [c for c in frontier(search.path, search.bound)
              if c.met and c is not failed and search.bound.score(c.evaluation.quality) > score and c.index != 0]
    out = sorted(better, key=search.cost)[:MAX_VALIDATION_TRIES - 1]
    baseline = search.path[0]
    if baseline.met and failed is not baseline:
        out.append(baseline)
    return out


def validate_held_out(search: Search, evaluator: Any, bound: Bound, chosen: Candidate, seeds: Sequence[int],
              search_seeds: Sequence[int], notes: list[str]
              ) -> tuple[Candidate, dict[str, Any] | None, dict[str, dict[str, float]], int]:
    """Check ``chosen`` on the held-out seeds, stepping along the frontier while it misses.

    Returns the candidate finally chosen, the validation record (``None`` when not
    validated), its quality summary over every seed measured, and the number of
    policies measured on the validation seeds.
    """
    validate = getattr(evaluator, "validate", None)
    per_search = dict(chosen.evaluation.per_seed)
    if not seeds or validate is None:
        notes.append("warning: validation disabled (no validation seeds): the chosen policy was measured on the "
                     "search seeds only, so a new input may fall below the bound" if not seeds else
                     "warning: this evaluator cannot measure other seeds (no validate method): the chosen policy "
                     "was measured on the search seeds only")
        return chosen, None, seed_summary(per_search) if per_search else {}, 0
    tried: list[dict[str, Any]] = []
    queue = [chosen, *_fallbacks(search, chosen)]
    measured: list[tuple[Candidate, dict[int, dict[str, float]], dict[str, float]]] = []
    for cand in queue:
        if search.should_stop is not None and search.should_stop():
            notes.append("validation stopped on request: the policies tried so far are reported")
            break
        search.phase(f"validating #{cand.index} on {len(seeds)} held-out seeds")
        per_seed = validate(cand.policy, seeds)
        worst = worst_case(list(per_seed.values()))
        tried.append({"index": cand.index, "worst": worst.get(bound.key), "met": bound.met(worst), "per_seed": per_seed})
        measured.append((cand, per_seed, worst))
        if tried[-1]["met"]:
            break
    if not measured:
        return chosen, None, seed_summary(per_search) if per_search else {}, 0
    # the one that met, else the closest tried
    final, final_seeds, _ = max(measured, key=lambda m: (bound.met(m[2]), bound.score(m[2])))
    first = tried[0]
    if not first["met"] and tried[-1]["met"]:
        notes.append(f"#{chosen.index} ({chosen.step}) met {search.bound} on the search seeds but reached only "
                     f"{bound.key} {first['worst']:.4g} on a validation seed (bound {bound}); stepped to #{final.index} "
                     f"({final.step}), which meets it on all {len(seeds)} validation seeds")
    elif not first["met"]:
        notes.append(f"no candidate tried ({', '.join('#' + str(t['index']) for t in tried)}) meets {bound} on every "
                     f"validation seed; #{final.index} is the closest tried")
    if not final.evaluation.per_seed and search_seeds:  # reused from a store that kept no per-seed quality
        per_search = validate(final.policy, search_seeds)
    else:
        per_search = dict(final.evaluation.per_seed)
    worst_value = next(t["worst"] for t in tried if t["index"] == final.index)
    search_worst = final.evaluation.quality.get(bound.key)
    sign = 1.0 if bound.higher_is_better else -1.0
    margin = None if worst_value is None else sign * (worst_value - bound.value)
    drop = None if worst_value is None or search_worst is None else sign * (search_worst - worst_value)
    allowed = abs(search.bound.value - bound.value)
    chosen_worst = chosen.evaluation.quality.get(bound.key)
    first_drop = (sign * (chosen_worst - first["worst"])
                  if first["worst"] is not None and chosen_worst is not None else math.nan)
    if not first["met"] and math.isfinite(first_drop) and first_drop > allowed:
        notes.append(f"{bound.key} of #{chosen.index} dropped by {first_drop:.3g} from the search seeds' worst case to "
                     f"the validation seeds' worst case, more than the margin ({allowed:.3g}): a larger --margin "
                     f"suits this model's inputs")
    record = {"seeds": list(seeds), "worst": worst_value, "margin": margin, "search_worst": search_worst,
              "drop": drop, "met": bool(tried[-1]["met"]), "tried": tried}
    return final, record, seed_summary({**per_search, **final_seeds}), len(tried)
