"""Whether two benchmark runs can be compared at all, and why not.

Configurations are matched by (name, batch). Before any figure is compared,
:func:`comparable` names what makes two runs incomparable (another pipeline, size,
machine or device, no batch in common), :func:`baseline_problems` what makes a run
useless as a gate's baseline (its state, :func:`mixprec.bench.runstate.classify`: unfinished,
nothing measured, no fp32 reference, nothing timed), and :func:`nothing_in_common` why ``compare``
would have no row to show.
"""

from __future__ import annotations

from typing import Any

from mixprec._quote import clip, few, quote
from mixprec.bench import evidence, rundata
from mixprec.bench.runstate import UNUSABLE, classify, failure, main_quality, number

__all__ = ["main_quality", "number", "index", "failure", "comparable", "baseline_problems", "nothing_in_common"]

#: Failed configurations named in one message; the rest are counted.
_LISTED = 5


def index(run: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """The run's configurations by (name, batch)."""
    return {(c["name"], c["batch"]): c for c in run["configs"]}


def _batches(run: dict[str, Any]) -> list[int]:
    return sorted({c["batch"] for c in run["configs"]})


def comparable(run: dict[str, Any], baseline: dict[str, Any], *, allow_different_machine: bool = False) -> list[str]:
    """Why two runs cannot be compared: another pipeline, size, batch or machine."""
    problems = []
    for key, what in (("pipeline", "pipeline"), ("size", "size")):
        if key in run and key in baseline and run[key] != baseline[key]:
            problems.append(f"run {run.get('id', '?')} is {what} {quote(run[key])}, "
                            f"baseline {baseline.get('id', '?')} is {quote(baseline[key])}")
    batches, base_batches = set(_batches(run)), set(_batches(baseline))
    if batches and base_batches and not batches & base_batches:
        problems.append(f"no batch in common: run has {sorted(batches)}, baseline {sorted(base_batches)}")
    fp, base_fp = run.get("machine_fingerprint"), baseline.get("machine_fingerprint")
    devices = rundata.devices_differ(run, baseline)
    if not allow_different_machine and devices is not None:
        problems.append(f"measured on another device: run {run.get('id', '?')} on {devices[0]}, baseline "
                        f"{baseline.get('id', '?')} on {devices[1]} (a device's timings say nothing about another's, "
                        "even on one host); pass --allow-different-machine to compare anyway")
    elif not allow_different_machine and fp and base_fp and fp != base_fp:
        problems.append(f"measured on another machine (fingerprint {fp} vs {base_fp}); "
                        "pass --allow-different-machine to compare anyway")
    return problems


def baseline_problems(run: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """Why ``baseline`` gives the gate nothing to hold ``run`` to; empty where it can be gated against.

    A baseline that did not finish, measured nothing, in which every configuration failed, whose
    fp32 reference (quality and speed-ups are measured against it) did not run, or that timed
    nothing (:func:`mixprec.bench.runstate.classify`) would pass any run: the gate cannot decide on it.
    """
    state = classify(baseline)
    if state.usable:
        return []
    reasons = "; ".join(f"{kind}: {why}" for kind, why in state.problems if kind in UNUSABLE)
    return [f"baseline {baseline.get('id', '?')} has nothing to compare against ({reasons}); choose a --baseline run "
            f"that finished and in which {evidence.REFERENCE} and the configurations ran (mixprec runs list)"]


def nothing_in_common(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """Why runs ``a`` and ``b`` share no configuration at any batch, or ``None`` where they share one."""
    ia, ib = index(a), index(b)
    if set(ia) & set(ib):
        return None
    for run in (a, b):
        if not run["configs"]:
            return f"run {run.get('id', '?')} has no configuration (it measured nothing)"
    batches_a, batches_b = _batches(a), _batches(b)
    if not set(batches_a) & set(batches_b):
        return (f"no batch in common: run {a.get('id', '?')} was measured at batch {', '.join(map(str, batches_a))}, "
                f"run {b.get('id', '?')} at batch {', '.join(map(str, batches_b))}; compare runs measured at the same --batch")
    common = sorted(set(batches_a) & set(batches_b))

    def names(run: dict[str, Any]) -> str:
        found = sorted({c["name"] for c in run["configs"] if c["batch"] in common})
        return few(found, listed=_LISTED, show=lambda n: clip(n, limit=40, escape=True))

    return (f"no configuration in common at batch {', '.join(map(str, common))}: run {a.get('id', '?')} has {names(a)}, "
            f"run {b.get('id', '?')} has {names(b)}; compare runs that measured the same --configs")
