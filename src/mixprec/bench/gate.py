"""Compare two benchmark runs, and gate a run against a baseline for CI.

The gate implements the rollback triggers apps ask for: quality drop, latency
regression, memory increase and failure rate beyond given thresholds. Configurations
are matched by (name, batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mixprec.measure.metrics import intervals_overlap

__all__ = ["Thresholds", "gate", "compare", "comparable", "main_quality", "parse_percent", "thresholds_from_flags"]


def parse_percent(text: str, flag: str, *, upper: float | None = None) -> float:
    """``"5%"`` -> 0.05; the unit is required and the value bounded; errors name the flag.

    A bare number is refused: ``--max-quality-drop 5`` could mean 5% or 500%.

    Args:
        text: what the user wrote.
        flag: the option's name, for the message.
        upper: the largest allowed fraction (1.0 for rates: 100%); ``None`` for no bound.
    """
    raw = str(text).strip()
    if not raw.endswith("%"):
        try:
            float(raw)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: expected a percentage such as 5%") from None
        raise ValueError(f"{flag} {text!r}: give the unit, for example {raw}% (a bare number is ambiguous)")
    try:
        value = float(raw[:-1]) / 100
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected a percentage such as 5%") from None
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise ValueError(f"{flag} {text!r}: must be a finite percentage of 0% or more")
    if upper is not None and value > upper:
        raise ValueError(f"{flag} {text!r}: must be between 0% and {upper:.0%}")
    return value


def thresholds_from_flags(*, max_quality_drop: str, max_latency_regression: str, max_memory_increase: str,
                          max_failure_rate: str) -> "Thresholds":
    """Thresholds from the CLI's flags: every one needs its unit; rates and drops are 0-100%."""
    return Thresholds(
        max_quality_drop=parse_percent(max_quality_drop, "--max-quality-drop", upper=1.0),
        max_latency_regression=parse_percent(max_latency_regression, "--max-latency-regression"),
        max_memory_increase=parse_percent(max_memory_increase, "--max-memory-increase"),
        max_failure_rate=parse_percent(max_failure_rate, "--max-failure-rate", upper=1.0),
    )


@dataclass(frozen=True)
class Thresholds:
    max_quality_drop: float = 0.05
    max_latency_regression: float = 0.10
    max_memory_increase: float = 0.0
    max_failure_rate: float = 0.01


def main_quality(metrics: dict[str, Any]) -> tuple[str, float] | None:
    """The metric a configuration's quality is judged by (higher is better)."""
    for key in ("snr_db", "psnr_db", "sqnr_db"):
        value = metrics.get(key)
        if value is not None:
            return key, float(value)
    return None


def _index(run: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(c["name"], c["batch"]): c for c in run["configs"]}


def comparable(run: dict[str, Any], baseline: dict[str, Any], *, allow_different_machine: bool = False) -> list[str]:
    """Why two runs cannot be compared: another pipeline, size, batch or machine."""
    problems = []
    for key, what in (("pipeline", "pipeline"), ("size", "size")):
        if key in run and key in baseline and run[key] != baseline[key]:
            problems.append(f"run {run.get('id', '?')} is {what} {run[key]!r}, baseline {baseline.get('id', '?')} is {baseline[key]!r}")
    batches, base_batches = {c["batch"] for c in run["configs"]}, {c["batch"] for c in baseline["configs"]}
    if batches and base_batches and not batches & base_batches:
        problems.append(f"no batch in common: run has {sorted(batches)}, baseline {sorted(base_batches)}")
    fp, base_fp = run.get("machine_fingerprint"), baseline.get("machine_fingerprint")
    if not allow_different_machine and fp and base_fp and fp != base_fp:
        problems.append(f"measured on another machine (fingerprint {fp} vs {base_fp}); "
                        "pass --allow-different-machine to compare anyway")
    return problems


def gate(run: dict[str, Any], baseline: dict[str, Any], thresholds: Thresholds, *,
         allow_different_machine: bool = False) -> list[str]:
    """Every violation of ``thresholds`` by ``run`` against ``baseline`` (empty: pass).

    A run that is not ``complete``, a baseline that is not comparable (see
    :func:`comparable`), a configuration of the baseline missing from the run, and a
    configuration with fewer samples than asked (``partial``) are violations too: the
    gate never passes what it could not check.
    """
    violations: list[str] = []
    for label, which in (("run", run), ("baseline", baseline)):
        status = which.get("status", "complete")
        if status != "complete":
            violations.append(f"{label} {which.get('id', '?')} is {status}, not complete: it cannot be gated")
    violations += comparable(run, baseline, allow_different_machine=allow_different_machine)
    if not run["configs"]:
        violations.append(f"run {run.get('id', '?')} has no configuration")
    missing = sorted(set(_index(baseline)) - set(_index(run)))
    if missing:
        violations.append("configurations of the baseline missing from the run: "
                          + ", ".join(f"{name}@{batch}" for name, batch in missing))
    configs = run["configs"]
    failed = [c for c in configs if c["status"] != "ok" or (c["metrics"].get("nonfinite") or 0) > 0]
    rate = len(failed) / len(configs) if configs else 1.0
    if rate > thresholds.max_failure_rate:
        names = ", ".join(f"{c['name']}@{c['batch']} ({c['status'] if c['status'] != 'ok' else 'non-finite output'})" for c in failed)
        violations.append(f"failure rate {rate:.1%} > {thresholds.max_failure_rate:.1%}: {names}")
    base = _index(baseline)
    for key, cfg in _index(run).items():
        ref = base.get(key)
        label = f"{key[0]}@batch {key[1]}"
        if ref is None or cfg["status"] != "ok" or ref["status"] != "ok":
            continue
        new_m, old_m = cfg["metrics"], ref["metrics"]
        new_q, old_q = main_quality(new_m), main_quality(old_m)
        if new_q and old_q and new_q[0] == old_q[0] and math.isfinite(old_q[1]):
            drop = (old_q[1] - new_q[1]) / abs(old_q[1]) if old_q[1] else 0.0
            if drop > thresholds.max_quality_drop:
                violations.append(f"{label}: quality {new_q[0]} {new_q[1]:.2f} vs {old_q[1]:.2f} (drop {drop:.1%} > {thresholds.max_quality_drop:.1%})")
        new_t, old_t = new_m.get("latency_median"), old_m.get("latency_median")
        if new_t and old_t:
            regression = new_t / old_t - 1
            if regression > thresholds.max_latency_regression:
                violations.append(f"{label}: latency {new_t:.4f} s vs {old_t:.4f} s (+{regression:.1%} > {thresholds.max_latency_regression:.1%})")
        for metric in ("peak_mem_bytes", "weight_bytes"):
            new_b, old_b = new_m.get(metric), old_m.get(metric)
            if new_b is not None and old_b:
                increase = new_b / old_b - 1
                if increase > thresholds.max_memory_increase:
                    violations.append(f"{label}: {metric} {new_b / 2**20:.1f} MiB vs {old_b / 2**20:.1f} MiB "
                                      f"(+{increase:.1%} > {thresholds.max_memory_increase:.1%})")
    return violations


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per configuration: latency, quality and memory of run ``b`` relative to run ``a``.

    ``latency_significant`` is true when the two medians' confidence intervals do not
    overlap: the change exceeds the measurement noise.
    """
    problems = comparable(b, a, allow_different_machine=True)
    if any("pipeline" in p or "size" in p for p in problems):
        raise ValueError("cannot compare these runs: " + "; ".join(problems))
    rows = []
    index_a = _index(a)
    for key, cfg_b in _index(b).items():
        cfg_a = index_a.get(key)
        if cfg_a is None:
            continue
        ma, mb = cfg_a["metrics"], cfg_b["metrics"]
        row: dict[str, Any] = {"config": key[0], "batch": key[1], "status_a": cfg_a["status"], "status_b": cfg_b["status"]}
        if ma.get("latency_median") and mb.get("latency_median"):
            row["latency_a"], row["latency_b"] = ma["latency_median"], mb["latency_median"]
            row["latency_change"] = mb["latency_median"] / ma["latency_median"] - 1
            cis = [{"ci_low": m.get("latency_ci_low"), "ci_high": m.get("latency_ci_high")} for m in (ma, mb)]
            if all(c["ci_low"] is not None and c["ci_high"] is not None for c in cis):
                row["latency_significant"] = not intervals_overlap(*cis)
        qa, qb = main_quality(ma), main_quality(mb)
        if qa and qb and qa[0] == qb[0]:
            row["quality_metric"], row["quality_a"], row["quality_b"] = qa[0], qa[1], qb[1]
        if ma.get("peak_mem_bytes") is not None and mb.get("peak_mem_bytes") is not None:
            row["peak_mem_a"], row["peak_mem_b"] = ma["peak_mem_bytes"], mb["peak_mem_bytes"]
        rows.append(row)
    return rows
