"""The per-configuration table of a run as plain formatted text: the columns (:data:`COLUMNS`) and the rows
(:func:`render_table_rows`) the terminal, the HTML report and the UI share."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from mixprec.bench import rundata, runstate

__all__ = ["COLUMNS", "render_table_rows"]

MISSING = "—"


# --------------------------------------------------------------------------- cells


def _sig(v: float) -> str:
    """Three significant digits without scientific notation for ordinary magnitudes."""
    size = abs(v)
    if size >= 100:
        return f"{v:,.0f}"
    if size >= 10:
        return f"{v:.1f}"
    if size >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _fmt_seconds(value: Any) -> str:
    v = rundata.num(value)
    if v is None:
        return MISSING
    if (text := rundata.nonfinite_text(v)) is not None:
        return text
    if abs(v) < 1e-3:
        return f"{v * 1e6:.0f} µs"
    if abs(v) < 1:
        ms = v * 1e3
        return f"{ms:.{2 if abs(ms) < 10 else 1 if abs(ms) < 100 else 0}f} ms"
    return f"{v:.{2 if abs(v) < 100 else 0}f} s"


def _fmt_mib(value: Any) -> str:
    v = rundata.num(value)
    if v is None:
        return MISSING
    return rundata.nonfinite_text(v) or f"{v / 2**20:,.1f} MiB"


def _fmt_db(value: Any, *, decimals: int = 1, exact_when_inf: bool = True) -> str:
    v = rundata.num(value)
    if v is None:
        return MISSING
    if exact_when_inf and v == math.inf:
        return "exact"
    if (text := rundata.nonfinite_text(v)) is not None:
        return f"{text} dB" if math.isinf(v) else text
    return f"{v:.{decimals}f} dB"


def _fmt_with(pattern: str) -> Callable[[Any], str]:
    def fmt(value: Any) -> str:
        v = rundata.num(value)
        if v is None:
            return MISSING
        return rundata.nonfinite_text(v) or pattern.format(v)

    return fmt


def _fmt_sig(suffix: str = "") -> Callable[[Any], str]:
    def fmt(value: Any) -> str:
        v = rundata.num(value)
        if v is None:
            return MISSING
        return rundata.nonfinite_text(v) or f"{_sig(v)}{suffix}"

    return fmt


def _fmt_count(value: Any) -> str:
    v = rundata.num(value)
    if v is None:
        return MISSING
    return rundata.nonfinite_text(v) or f"{int(v):,}"


def _fmt_percent(value: Any) -> str:
    v = rundata.num(value)
    if v is None:
        return MISSING
    return rundata.nonfinite_text(v) or f"{v * 100:.1f}%"


# Optional metric columns: (row key, label, metric, formatter); shown when any config has the metric.
_METRIC_COLUMNS: tuple[tuple[str, str, str, Callable[[Any], str]], ...] = (
    ("tokens_per_s", "Tokens/s", "tokens_per_s", _fmt_sig()),
    ("rtf", "RTF", "rtf", _fmt_sig()),
    ("peak_mem", "Peak mem", "peak_mem_bytes", _fmt_mib),
    ("weights", "Weights", "weight_bytes", _fmt_mib),
    ("compile", "Compile", "compile_s", _fmt_with("{:.1f} s")),
    # Graphs of that compile loaded from torch's on-disk inductor cache: 100% in a later process.
    ("compile_cached", "Compiled from cache", "compile_cached", _fmt_percent),
    ("max_abs_err", "Max abs err", "max_abs_err", _fmt_with("{:.3g}")),
    ("rel_err", "Rel err", "rel_err", _fmt_with("{:.3g}")),
    ("cosine", "Cosine", "cosine", _fmt_with("{:.6f}")),
    ("sqnr", "SQNR", "sqnr_db", _fmt_db),
    ("snr", "SNR", "snr_db", _fmt_db),
    ("lsd", "LSD", "lsd_db", lambda v: _fmt_db(v, decimals=2, exact_when_inf=False)),
    ("psnr", "PSNR", "psnr_db", _fmt_db),
    ("ssim", "SSIM", "ssim", _fmt_with("{:.4f}")),
    # Teacher-forced: every denoising step's noise prediction on the fp32 run's latents.
    ("step_sqnr", "Step SQNR", "step_sqnr_db", _fmt_db),
    ("step_sqnr_worst", "Worst step", "step_sqnr_worst_db", _fmt_db),
    ("emb_cos_mean", "Emb cos mean", "embedding_cosine_mean", _fmt_with("{:.6f}")),
    ("emb_cos_min", "Emb cos min", "embedding_cosine_min", _fmt_with("{:.6f}")),
    ("token_agreement", "Token agreement", "token_agreement", _fmt_percent),
    ("nonfinite", "Non-finite", "nonfinite", _fmt_count),
    ("fallbacks", "Fallbacks", "fallbacks", _fmt_count),
)

#: Every table column as (row key, header label), in display order. A row from
#: :func:`render_table_rows` has the keys of the base columns and of the metric
#: columns that at least one configuration of the run measured.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("config", "Config"),
    ("batch", "Batch"),
    ("status", "Status"),
    ("policy", "Policy"),
    ("latency", "Latency"),
    ("ci", "Latency CI"),
    ("speedup", "Speedup"),
    ("throughput", "Throughput"),
    *((key, label) for key, label, _, _ in _METRIC_COLUMNS),
    ("error", "Error"),
)


# --------------------------------------------------------------------------- rows


def _error_summary(value: Any) -> str:
    """The exception line of a stored error; its traceback stays in the store and the JSON/CSV export."""
    return rundata.text(value).split("\nTraceback (most recent call last):", 1)[0].strip()


def _policy_name(config: Mapping[str, Any]) -> str:
    policy = config.get("policy")
    if isinstance(policy, Mapping) and policy.get("name") is not None:
        return str(policy["name"])
    return MISSING


def _speedup(run: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """The speed-up cell (:func:`mixprec.bench.evidence.speedup_cell`): a figure only where its
    interval supports it, else ``undecided``/``unstable`` with what was measured."""
    from mixprec.bench import evidence  # numpy/scipy: loaded when a table is rendered, not on import

    if rundata.num(rundata.metrics(config).get("speedup")) is None and not config.get("samples"):
        return MISSING
    ref = evidence.reference(run, config.get("batch"))
    is_reference = ref is not None and ref.get("name") == config.get("name")
    interval = None if is_reference else evidence.speedup(run, config)
    unstable = bool(rundata.num(rundata.metrics(config).get("unstable")))
    return evidence.speedup_cell(interval, unstable=unstable, reference=is_reference)


def render_table_rows(run: Mapping[str, Any]) -> list[dict[str, str]]:
    """The per-configuration table of a run, formatted as plain text.

    Shared by the HTML report and the terminal table, so it holds no markup and
    no escaping. Every row has the same keys: those of :data:`COLUMNS` whose
    column applies to the run (a metric column appears when any configuration
    measured that metric). Missing values read ``—``; an infinite SQNR, SNR,
    PSNR or step SQNR (output identical to fp32) reads ``exact``; ``error`` is empty for
    configurations that ran.

    Args:
        run: a run dict as the store returns it.
    """
    configs = rundata.configs(run)
    metric_columns = [col for col in _METRIC_COLUMNS if rundata.has_metric(configs, col[2])]
    rows = []
    for config in configs:
        metrics = rundata.metrics(config)
        lat = rundata.latency(config)
        if lat is None:
            latency, ci = MISSING, MISSING
        else:
            latency = _fmt_seconds(lat["median"])
            if lat["ci_low"] is None or lat["ci_high"] is None:
                ci = MISSING
            else:
                ci = f"{_fmt_seconds(lat['ci_low'])} – {_fmt_seconds(lat['ci_high'])}"
                if lat["ci_exact"] is False:
                    ci += " (min–max)"
        row = {
            "config": rundata.text(config.get("name")),
            "batch": rundata.text(config.get("batch")),
            "status": runstate.shown_status(config),
            "policy": _policy_name(config),
            "latency": latency,
            "ci": ci,
            "speedup": _speedup(run, config),
            "throughput": _fmt_sig(" items/s")(metrics.get("throughput_items_per_s")),
        }
        for key, _, metric, fmt in metric_columns:
            row[key] = fmt(metrics.get(metric))
        # an ok whose rows hold no measurement says why beside its status
        row["error"] = _error_summary(config.get("error")) or (runstate.unmeasured(config) or "")
        rows.append(row)
    return rows

