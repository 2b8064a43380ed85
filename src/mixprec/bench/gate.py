"""Compare two benchmark runs, and gate a run against a baseline for CI.

The gate implements the rollback triggers apps ask for: quality drop, latency
regression, memory increase and failure rate beyond given thresholds. Configurations
are matched by (name, batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mixprec.bench.metrics import intervals_overlap

__all__ = ["Thresholds", "gate", "compare", "main_quality", "parse_percent"]


def parse_percent(text: str, flag: str) -> float:
    """``"5%"`` or ``"0.05"`` -> 0.05; errors name the flag."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected a percentage such as 5% or a fraction such as 0.05") from None
    if value < 0 or math.isnan(value):
        raise ValueError(f"{flag} {text!r}: must be zero or more")
    return value


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


def gate(run: dict[str, Any], baseline: dict[str, Any], thresholds: Thresholds) -> list[str]:
    """Every violation of ``thresholds`` by ``run`` against ``baseline`` (empty: pass)."""
    violations: list[str] = []
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
