"""Whether two benchmark runs can be compared at all, and why not.

Configurations are matched by (name, batch). Before any figure is compared,
:func:`comparable` names what makes two runs incomparable (another pipeline, size,
machine or device, no batch in common), :func:`baseline_problems` what makes a run
useless as a gate's baseline (nothing measured, every configuration failed, no fp32
reference where the run was measured), and :func:`nothing_in_common` why ``compare``
would have no row to show.
"""

from __future__ import annotations

import math
from typing import Any

from mixprec._quote import clip, quote
from mixprec.bench import evidence, rundata

__all__ = ["main_quality", "number", "index", "failure", "comparable", "baseline_problems", "nothing_in_common"]

#: Failed configurations named in one message; the rest are counted.
_LISTED = 5


def main_quality(metrics: dict[str, Any]) -> tuple[str, float] | None:
    """The metric a configuration's quality is judged by (higher is better)."""
    for key in ("snr_db", "psnr_db", "sqnr_db"):
        value = metrics.get(key)
        if value is not None:
            return key, float(value)
    return None


def number(metrics: dict[str, Any], name: str) -> float | None:
    """The metric ``name`` as a float, or ``None`` where it is missing or not a number."""
    value = metrics.get(name)
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def index(run: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    """The run's configurations by (name, batch)."""
    return {(c["name"], c["batch"]): c for c in run["configs"]}


def failure(cfg: dict[str, Any], ref: dict[str, Any] | None) -> str | None:
    """Why a configuration counts as failed, or ``None``; ``ref``: its baseline's configuration, if any."""
    metrics = cfg["metrics"]
    if cfg["status"] != "ok":
        return cfg["status"]
    if (number(metrics, "nonfinite") or 0) > 0:
        return "non-finite output"
    if (number(metrics, "shape_mismatch") or 0) > 0:
        return "output shape differs from fp32's"
    old = main_quality(ref["metrics"]) if ref is not None and ref["status"] == "ok" else None
    if old is not None:
        new = number(metrics, old[0])
        if new is None or math.isnan(new):
            return "no quality figure"
    return None


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


def _failed_list(configs: list[dict[str, Any]]) -> str:
    shown = []
    for cfg in configs[:_LISTED]:
        why = failure(cfg, None)
        error = f": {clip(cfg['error'], limit=80, escape=True)}" if cfg.get("error") else ""
        shown.append(f"{clip(cfg['name'], limit=40, escape=True)}@{cfg['batch']} ({why}{error})")
    more = f" and {len(configs) - _LISTED} more" if len(configs) > _LISTED else ""
    return ", ".join(shown) + more


def baseline_problems(run: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """Why ``baseline`` gives the gate nothing to hold ``run`` to; empty where it can be gated against.

    A baseline that measured nothing, in which every configuration failed, or whose fp32
    reference (quality and speed-ups are measured against it) did not run at any batch the
    run was measured at, would pass any run: each is a reason the gate fails.
    """
    bid = baseline.get("id", "?")
    choose = "choose a --baseline run in which fp32 and the configurations ran (mixprec runs list)"
    configs = baseline["configs"]
    if not configs:
        return [f"baseline {bid} has no configuration: it measured nothing to compare against; {choose}"]
    if all(failure(c, None) is not None for c in configs):
        return [f"baseline {bid} cannot be compared against: every configuration in it failed "
                f"({_failed_list(configs)}); {choose}"]
    common = sorted(set(_batches(run)) & set(_batches(baseline))) or _batches(baseline)
    references = [b for b in common if any(c["name"] == evidence.REFERENCE and c["batch"] == b and failure(c, None) is None
                                           for c in configs)]
    if not references:
        at = f"batch {common[0]}" if len(common) == 1 else f"batches {', '.join(map(str, common))}"
        return [f"baseline {bid} has no successful {evidence.REFERENCE} reference at {at}: its quality and "
                f"speed-ups are measured against {evidence.REFERENCE}, so it holds the run to nothing; {choose}"]
    return []


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
        listed = ", ".join(clip(n, limit=40, escape=True) for n in found[:_LISTED])
        return listed + (f" and {len(found) - _LISTED} more" if len(found) > _LISTED else "")

    return (f"no configuration in common at batch {', '.join(map(str, common))}: run {a.get('id', '?')} has {names(a)}, "
            f"run {b.get('id', '?')} has {names(b)}; compare runs that measured the same --configs")
