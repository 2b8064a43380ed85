"""Reading a run the way the table, plots, HTML report and exports all do: its configurations and batch groups,
metric values as numbers, the latency median and its confidence interval.

A run is the plain dict :meth:`mixprec.bench.store.Store.load_run` returns (id, timestamps, status, pipeline, size,
machine, versions, notes and configurations with their samples, metrics, policy and error).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from mixprec.measure.metrics import latency_stats

__all__ = ["batches", "configs", "device", "devices_differ", "group", "has_metric", "latency", "metrics", "nonfinite_text", "num",
           "text"]


def num(value: Any) -> float | None:
    """A metric value as a float; ``None`` for missing or unreadable values."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def nonfinite_text(v: float) -> str | None:
    """``"nan"``, ``"inf"`` or ``"-inf"`` for a non-finite value; ``None`` for a finite one."""
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return None


def text(value: Any) -> str:
    """A stored value as text; ``None`` reads as the empty string."""
    return "" if value is None else str(value)


def device(run: Mapping[str, Any]) -> str | None:
    """The device a run was measured on: ``cpu``, ``cuda``, ``cuda:1``, ``mps``.

    Runs store it with their machine (``machine["device"]``); a run stored before that
    is read from its probed hardware's device type; ``None`` where neither says.
    """
    machine = run.get("machine") or {}
    value = machine.get("device") or machine.get("device_type")
    return str(value) if value else None


def devices_differ(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(device of a, device of b)`` where the two runs were measured on different kinds of
    device (``cpu`` and ``cuda``); ``None`` where they share one or either does not say.

    Two GPUs of one kind (``cuda:0``, ``cuda:1``) differ only where their machine
    fingerprints do (another model), as two machines do.
    """
    da, db = device(a), device(b)
    if da is None or db is None or da.split(":")[0] == db.split(":")[0]:
        return None
    return da, db


def configs(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The configurations of a run, in stored order."""
    return list(run.get("configs") or [])


def metrics(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The metrics of a configuration (empty when it measured none)."""
    return config.get("metrics") or {}


def has_metric(configs: Sequence[Mapping[str, Any]], name: str) -> bool:
    """Whether any of ``configs`` measured the metric ``name``."""
    return any(metrics(c).get(name) is not None for c in configs)


def latency(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """Median and CI from the stored metrics, else computed from the raw samples."""
    values = metrics(config)
    median = num(values.get("latency_median"))
    if median is not None:
        exact = values.get("latency_ci_exact")
        return {
            "median": median,
            "ci_low": num(values.get("latency_ci_low")),
            "ci_high": num(values.get("latency_ci_high")),
            "ci_exact": None if exact is None else bool(num(exact)),
        }
    samples = [s for s in (num(x) for x in config.get("samples") or []) if s is not None and math.isfinite(s)]
    if not samples:
        return None
    stats = latency_stats(samples)
    return {"median": stats["median"], "ci_low": stats["ci_low"], "ci_high": stats["ci_high"],
            "ci_exact": bool(stats["ci_exact"])}


def batches(run: Mapping[str, Any]) -> list[Any]:
    """The batch sizes of a run, in the order its configurations first use them."""
    seen: list[Any] = []
    for config in configs(run):
        if config.get("batch") not in seen:
            seen.append(config.get("batch"))
    return seen


def group(run: Mapping[str, Any], batch: Any) -> list[Mapping[str, Any]]:
    """The configurations of a run measured at batch size ``batch``."""
    return [c for c in configs(run) if c.get("batch") == batch]
