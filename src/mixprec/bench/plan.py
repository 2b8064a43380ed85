"""Fit a benchmark into a time budget, from what this machine measures.

The fp32 reference worker is loaded and run once first (its run is the reference
output, so the calibration costs nothing extra). From its load time and run time the
benchmark's length is estimated for each choice of warm-up and timed runs, and the
richest choice that fits the budget is taken. When even one timed run per
configuration does not fit, a pipeline that declares a work option (the diffusion
pipeline's denoising ``steps``, the TTS pipeline's ``num_tokens``) is shortened in
proportion, never below the option's smallest useful value; when even that does not
fit, configurations are left out (the costliest first, fp32 never), each named as not
measured with the reason.

The estimate follows the load the calibration ran under: the other workers load in
parallel, and on a machine where other processes compete for the cores they get only
their share of it, so the load's CPU seconds (what the reference's load used) are spread
over the cores in proportion to our workers among every runnable process.

Every choice is explained in :attr:`Plan.reason`, which the run's notes carry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Calibration", "Plan", "plan_runs", "config_cost", "parse_budget", "batch_limit", "drop_order",
           "OTHER_CONFIG_COST", "PLAN_MARGIN"]

#: A configuration other than fp32 may take this many times the reference's run time
#: (measured on 2-core CPUs: 0.8x to 1.25x for the presets and matmul levels).
OTHER_CONFIG_COST = 1.3
#: The estimate must fit in this fraction of the budget (the rest absorbs noise).
PLAN_MARGIN = 0.9


@dataclass(frozen=True)
class Calibration:
    """What the fp32 reference worker measured before anything else ran.

    Attributes:
        load_s: seconds from starting the worker to its model being loaded.
        run_s: seconds of its first (reference) run.
        weight_bytes: bytes of the pipeline's weights.
        peak_bytes: memory its reference run took above the loaded model (RSS or CUDA).
        work: the pipeline's work option and its value, e.g. ``("steps", 10)``, if it has one.
        work_min: that option's smallest useful value.
        load_cpu_s: CPU seconds the reference worker used to load (``None``: not known;
            the wall time ``load_s`` stands in).
        busy: other processes ready to run on this machine when it was measured.
    """

    load_s: float
    run_s: float
    weight_bytes: int = 0
    peak_bytes: int = 0
    work: tuple[str, int] | None = None
    work_min: int | None = None
    load_cpu_s: float | None = None
    busy: int = 0


@dataclass
class Plan:
    """How many runs to make, and at what work size.

    Attributes:
        warmup: untimed runs per configuration.
        repeat: timed runs per configuration.
        work: ``{option: value}`` to rebuild the pipeline with (empty: as it is).
        estimate_s: the expected seconds for this batch size.
        reason: one line saying what was measured and why this was chosen.
        dropped: positions (in the ``costs`` given) of configurations left out to fit.
    """

    warmup: int
    repeat: int
    work: dict[str, int] = field(default_factory=dict)
    estimate_s: float = 0.0
    reason: str = ""
    dropped: list[int] = field(default_factory=list)


def parse_budget(text: str, source: str = "--budget") -> float:
    """Seconds from ``"420"``, ``"420s"``, ``"7m"``, ``"6m30s"`` or ``"1h"``.

    Raises:
        ValueError: naming ``source``, the value and the accepted forms.
    """
    import re

    raw = str(text).strip().lower()
    match = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?", raw)
    if raw and match and any(match.groups()):
        hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
        total = hours * 3600 + minutes * 60 + seconds
        if math.isfinite(total) and total > 0:
            return total
    from mixprec._quote import quote

    raise ValueError(f"{source} {quote(text)}: expected a positive duration such as 420, 420s, 7m or 6m30s")


def config_cost(spec: Any, hardware: Any) -> float:
    """Expected seconds per run of ``spec``, in units of the fp32 reference's run.

    A configuration that computes in a dtype the probe measured as emulated costs
    the inverse of the measured speed ratio; any other configuration
    :data:`OTHER_CONFIG_COST` (fp32 itself: 1).
    """
    if spec.kind == "baseline":
        return 1.0
    dtype = getattr(spec, "dtype", None)
    if dtype and hardware is not None and dtype in hardware.dtypes:
        speed = hardware.dtypes[dtype]
        if speed.emulated and speed.ratio:
            return max(OTHER_CONFIG_COST, 1.0 / speed.ratio)
    return OTHER_CONFIG_COST


def loading_s(cal: Calibration, workers: int, cores: int) -> float:
    """Seconds for ``workers`` more workers to load at once, after the reference.

    On a quiet machine they load ``cores`` at a time, each as long as the reference did.
    With ``cal.busy`` other runnable processes, the workers get ``workers / (busy +
    workers)`` of the cores, so their CPU seconds of loading take that much longer.
    """
    if workers <= 0:
        return 0.0
    quiet = cal.load_s * math.ceil(workers / max(1, cores))
    cpu = cal.load_cpu_s if cal.load_cpu_s is not None else cal.load_s
    shared = cpu * workers * (cal.busy + workers) / (max(1, cores) * workers)
    return max(quiet, shared)


def _estimate(cal: Calibration, costs: list[float], warmup: int, repeat: int, scale: float, cores: int,
              reload: bool = False) -> float:
    """Seconds for one batch size: loading the other workers, then every run.

    The reference's calibration run counts as its first warm-up run (it makes one more
    run when there is no warm-up); ``reload``: the reference is loaded and run again at
    the new work size first.
    """
    loads = loading_s(cal, len(costs) - 1, cores)
    runs = warmup + repeat
    per_round = cal.run_s * scale * sum(costs)
    reference_extra = 0.0 if warmup > 0 else cal.run_s * scale
    again = cal.load_s + cal.run_s * scale if reload else 0.0
    return again + loads + per_round * runs + reference_extra


def drop_order(costs: list[float], protected: list[bool] | None = None) -> list[int]:
    """Positions of configurations in the order a tight budget leaves them out.

    The costliest first; among equal costs the unprotected ones (``protected[i]``
    false, e.g. the alternatives users would pick by hand) before the protected ones
    (mixprec's own presets and policy files), and later ones before earlier ones.
    Position 0 (the fp32 reference) is never left out.
    """
    protected = protected or [False] * len(costs)
    return sorted(range(1, len(costs)), key=lambda i: (-costs[i], protected[i], -i))


def plan_runs(cal: Calibration, costs: list[float], *, budget_s: float, max_warmup: int, max_repeat: int,
              cores: int = 1, order: list[int] | None = None, can_shorten: bool = True) -> Plan:
    """The richest (warm-up, timed runs, work size, configurations) whose estimate fits ``budget_s``.

    Preference: the asked warm-up and timed runs; then fewer timed runs (down to 2);
    then 2 timed runs without warm-up (a spread beats a warm-up on a 2-core CPU, where
    first runs cost little extra); then one warm-up and one timed run; one timed run;
    then, with one timed run and no warm-up, the work option lowered in proportion (not
    below its minimum); then configurations left out in ``order`` (default
    :func:`drop_order`) until the rest fits. Only when fp32 alone does not fit is the
    estimate above the budget, and the reason says by how much.

    Args:
        cal: what the reference worker measured (and the load it measured under).
        costs: per configuration (fp32 first), its run time in reference runs
            (see :func:`config_cost`).
        budget_s: seconds this batch size may take from now on.
        max_warmup, max_repeat: the most to make (the user's ``--warmup`` and ``--repeat``).
        cores: how many cores the workers share.
        order: positions to leave out first when configurations must go.
        can_shorten: whether the work option may be lowered (not once the workers are built).
    """
    usable = budget_s * PLAN_MARGIN
    measured = (f"fp32 reference {cal.run_s:.2f} s per run, load {cal.load_s:.1f} s, {len(costs)} configurations, "
                f"{budget_s:.0f} s of the budget left" + (f", {cal.busy} other runnable processes" if cal.busy else ""))
    candidates: list[tuple[int, int]] = []
    for repeat in range(max_repeat, 1, -1):
        candidates.append((max_warmup, repeat))
    candidates += [(0, 2), (min(max_warmup, 1), 1), (0, 1)]
    seen: set[tuple[int, int]] = set()
    for warmup, repeat in candidates:
        if (warmup, repeat) in seen or repeat > max_repeat or warmup > max_warmup:
            continue
        seen.add((warmup, repeat))
        estimate = _estimate(cal, costs, warmup, repeat, 1.0, cores)
        if estimate <= usable:
            asked = (warmup, repeat) == (max_warmup, max_repeat)
            why = "as asked" if asked else (f"the asked {max_warmup} warm-up + {_runs(max_repeat)} would take about "
                                            f"{_estimate(cal, costs, max_warmup, max_repeat, 1.0, cores):.0f} s")
            return Plan(warmup, repeat, {}, estimate,
                        f"{warmup} warm-up + {_runs(repeat)} per configuration, about {estimate:.0f} s ({why}; {measured})")
    smallest = _estimate(cal, costs, 0, 1, 1.0, cores)
    work: dict[str, int] = {}
    scale, head = 1.0, f"1 timed run, no warm-up: even that would take about {smallest:.0f} s"
    if can_shorten and cal.work is not None and cal.work_min is not None and cal.work[1] > cal.work_min:
        option, value = cal.work
        fixed = _estimate(cal, costs, 0, 1, 0.0, cores, reload=True)
        variable = _estimate(cal, costs, 0, 1, 1.0, cores, reload=True) - fixed
        fraction = max(0.0, (usable - fixed) / variable) if variable > 0 else 1.0
        new = max(cal.work_min, min(value, math.floor(value * fraction)))
        if new < value:
            work, scale = {option: new}, new / value
            estimate = _estimate(cal, costs, 0, 1, scale, cores, reload=True)
            head = (f"{option} {value} -> {new} and 1 timed run, no warm-up: even one timed run at {option}={value} "
                    f"would take about {smallest:.0f} s")
            if estimate <= usable:
                return Plan(0, 1, work, estimate, f"{head}; about {estimate:.0f} s ({measured})")
    elif cal.work is None:
        head += " and the pipeline has no work option to shorten"
    elif can_shorten:
        head += f" and its {cal.work[0]} ({cal.work[1]}) cannot go lower"
    # Leave configurations out: at the shortened work size, and at the full one (which saves
    # reloading the reference); the choice that keeps more configurations wins, the
    # shortened one on a tie, as the preference order says.
    options = [(work, scale)] + ([({}, 1.0)] if work else [])
    best: tuple[list[int], list[int], dict[str, int], float, float] | None = None
    for option_work, option_scale in options:
        kept, dropped = _drop(cal, costs, option_scale, cores, bool(option_work), usable, order)
        estimate = _estimate(cal, [costs[i] for i in kept], 0, 1, option_scale, cores, reload=bool(option_work))
        if best is None or len(kept) > len(best[0]) or (len(kept) == len(best[0]) and estimate < best[3] and
                                                         best[3] > usable):
            best = (kept, dropped, option_work, estimate, option_scale)
    assert best is not None
    kept, dropped, work, estimate, _ = best
    if not work and head.startswith(f"{cal.work[0] if cal.work else ''} "):
        head = f"1 timed run, no warm-up: even that would take about {smallest:.0f} s"
    over = "" if estimate <= budget_s else f"; still about {estimate - budget_s:.0f} s over the budget with fp32 alone"
    left_out = (f"; {len(dropped)} of {len(costs)} configurations left out to fit (not measured)" if dropped else "")
    return Plan(0, 1, work, estimate, f"{head}{left_out}; about {estimate:.0f} s ({measured}){over}", dropped)


def _drop(cal: Calibration, costs: list[float], scale: float, cores: int, reload: bool, usable: float,
          order: list[int] | None) -> tuple[list[int], list[int]]:
    """(kept, left out) positions: configurations left out in ``order`` until the estimate fits."""
    kept = list(range(len(costs)))
    dropped: list[int] = []
    for index in (order if order is not None else drop_order(costs)):
        if index == 0 or index not in kept:
            continue
        if _estimate(cal, [costs[i] for i in kept], 0, 1, scale, cores, reload=reload) <= usable:
            break
        kept.remove(index)
        dropped.append(index)
    return kept, dropped


def _runs(n: int) -> str:
    return f"{n} timed run{'' if n == 1 else 's'}"


def batch_limit(cal: Calibration, *, workers: int, available_bytes: int, batch_measured: int = 1) -> int:
    """The largest batch ``workers`` workers can hold at once in ``available_bytes``.

    Each worker holds the weights and, per item, what the reference run took above the
    loaded model at ``batch_measured`` items (at least 1 MiB per item).
    """
    per_item = max(1 << 20, cal.peak_bytes // max(1, batch_measured))
    room = available_bytes // max(1, workers) - cal.weight_bytes
    return max(0, int(room // per_item))
