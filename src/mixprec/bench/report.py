"""Benchmark reports: run dicts in, one self-contained HTML page (or CSV / JSON) out.

A *run* is the plain dict :meth:`mixprec.bench.store.Store.load_run` returns
(id, timestamps, status, pipeline, size, machine, versions, notes and a list of
configurations with their samples, metrics, policy and error). Everything here is
a pure function of the runs, except :func:`save_html`, which only writes
:func:`render_html`'s result to a file. The output depends on nothing but the
input: no timestamps, no randomness, and the PNG files carry no metadata.

Plots are drawn with :class:`matplotlib.figure.Figure` on an Agg canvas, never
through ``pyplot``, so the matplotlib backend an application selected stays as it is.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import os
from base64 import b64encode
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from mixprec.measure.metrics import latency_stats, pareto_front

__all__ = [
    "COLUMNS",
    "QUALITY_LABELS",
    "main_quality_key",
    "render_table_rows",
    "render_html",
    "main_plot_png",
    "save_html",
    "to_csv",
    "to_json",
]

MISSING = "—"

#: Metrics of a configuration, in the order the exports list them.
METRIC_ORDER: tuple[str, ...] = (
    "latency_median", "latency_p10", "latency_p90", "latency_mean", "latency_ci_low", "latency_ci_high",
    "latency_ci_exact", "speedup", "throughput_items_per_s", "tokens_per_s", "rtf", "peak_mem_bytes",
    "weight_bytes", "compile_s", "max_abs_err", "rel_err", "cosine", "sqnr_db", "snr_db", "lsd_db", "psnr_db", "ssim",
    "embedding_cosine_mean", "embedding_cosine_min", "token_agreement", "nonfinite", "fallbacks",
)

#: Axis labels of the quality metrics the latency/quality plot can use.
QUALITY_LABELS: dict[str, str] = {"snr_db": "SNR (dB)", "sqnr_db": "SQNR (dB)", "psnr_db": "PSNR (dB)"}


# --------------------------------------------------------------------------- numbers


def _num(value: Any) -> float | None:
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


def _special(v: float) -> str | None:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return None


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
    v = _num(value)
    if v is None:
        return MISSING
    if (text := _special(v)) is not None:
        return text
    if abs(v) < 1e-3:
        return f"{v * 1e6:.0f} µs"
    if abs(v) < 1:
        ms = v * 1e3
        return f"{ms:.{2 if abs(ms) < 10 else 1 if abs(ms) < 100 else 0}f} ms"
    return f"{v:.{2 if abs(v) < 100 else 0}f} s"


def _fmt_mib(value: Any) -> str:
    v = _num(value)
    if v is None:
        return MISSING
    return _special(v) or f"{v / 2**20:,.1f} MiB"


def _fmt_db(value: Any, *, decimals: int = 1, exact_when_inf: bool = True) -> str:
    v = _num(value)
    if v is None:
        return MISSING
    if exact_when_inf and v == math.inf:
        return "exact"
    if (text := _special(v)) is not None:
        return f"{text} dB" if math.isinf(v) else text
    return f"{v:.{decimals}f} dB"


def _fmt_with(pattern: str) -> Callable[[Any], str]:
    def fmt(value: Any) -> str:
        v = _num(value)
        if v is None:
            return MISSING
        return _special(v) or pattern.format(v)

    return fmt


def _fmt_sig(suffix: str = "") -> Callable[[Any], str]:
    def fmt(value: Any) -> str:
        v = _num(value)
        if v is None:
            return MISSING
        return _special(v) or f"{_sig(v)}{suffix}"

    return fmt


def _fmt_count(value: Any) -> str:
    v = _num(value)
    if v is None:
        return MISSING
    return _special(v) or f"{int(v):,}"


def _fmt_percent(value: Any) -> str:
    v = _num(value)
    if v is None:
        return MISSING
    return _special(v) or f"{v * 100:.1f}%"


# Optional metric columns: (row key, label, metric, formatter); shown when any config has the metric.
_METRIC_COLUMNS: tuple[tuple[str, str, str, Callable[[Any], str]], ...] = (
    ("tokens_per_s", "Tokens/s", "tokens_per_s", _fmt_sig()),
    ("rtf", "RTF", "rtf", _fmt_sig()),
    ("peak_mem", "Peak mem", "peak_mem_bytes", _fmt_mib),
    ("weights", "Weights", "weight_bytes", _fmt_mib),
    ("compile", "Compile", "compile_s", _fmt_with("{:.1f} s")),
    ("max_abs_err", "Max abs err", "max_abs_err", _fmt_with("{:.3g}")),
    ("rel_err", "Rel err", "rel_err", _fmt_with("{:.3g}")),
    ("cosine", "Cosine", "cosine", _fmt_with("{:.6f}")),
    ("sqnr", "SQNR", "sqnr_db", _fmt_db),
    ("snr", "SNR", "snr_db", _fmt_db),
    ("lsd", "LSD", "lsd_db", lambda v: _fmt_db(v, decimals=2, exact_when_inf=False)),
    ("psnr", "PSNR", "psnr_db", _fmt_db),
    ("ssim", "SSIM", "ssim", _fmt_with("{:.4f}")),
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


# --------------------------------------------------------------------------- run data


def _configs(run: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(run.get("configs") or [])


def _metrics(config: Mapping[str, Any]) -> Mapping[str, Any]:
    return config.get("metrics") or {}


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _error_summary(value: Any) -> str:
    """The exception line of a stored error; its traceback stays in the store and the JSON/CSV export."""
    return _text(value).split("\nTraceback (most recent call last):", 1)[0].strip()


def _latency(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """Median and CI from the stored metrics, else computed from the raw samples."""
    metrics = _metrics(config)
    median = _num(metrics.get("latency_median"))
    if median is not None:
        exact = metrics.get("latency_ci_exact")
        return {
            "median": median,
            "ci_low": _num(metrics.get("latency_ci_low")),
            "ci_high": _num(metrics.get("latency_ci_high")),
            "ci_exact": None if exact is None else bool(_num(exact)),
        }
    samples = [s for s in (_num(x) for x in config.get("samples") or []) if s is not None and math.isfinite(s)]
    if not samples:
        return None
    stats = latency_stats(samples)
    return {"median": stats["median"], "ci_low": stats["ci_low"], "ci_high": stats["ci_high"],
            "ci_exact": bool(stats["ci_exact"])}


def _has_metric(configs: Sequence[Mapping[str, Any]], name: str) -> bool:
    return any(_metrics(c).get(name) is not None for c in configs)


def main_quality_key(run: Mapping[str, Any]) -> str:
    """The metric a run's latency/quality plot uses.

    ``psnr_db`` for image pipelines, ``snr_db`` for audio ones, ``sqnr_db``
    otherwise (embeddings, token outputs), decided by which metrics the run holds.
    """
    configs = _configs(run)
    for key in ("psnr_db", "snr_db"):
        if _has_metric(configs, key):
            return key
    return "sqnr_db"


def _batches(run: Mapping[str, Any]) -> list[Any]:
    seen: list[Any] = []
    for config in _configs(run):
        if config.get("batch") not in seen:
            seen.append(config.get("batch"))
    return seen


def _group(run: Mapping[str, Any], batch: Any) -> list[Mapping[str, Any]]:
    return [c for c in _configs(run) if c.get("batch") == batch]


def _policy_name(config: Mapping[str, Any]) -> str:
    policy = config.get("policy")
    if isinstance(policy, Mapping) and policy.get("name") is not None:
        return str(policy["name"])
    return MISSING


def render_table_rows(run: Mapping[str, Any]) -> list[dict[str, str]]:
    """The per-configuration table of a run, formatted as plain text.

    Shared by the HTML report and the terminal table, so it holds no markup and
    no escaping. Every row has the same keys: those of :data:`COLUMNS` whose
    column applies to the run (a metric column appears when any configuration
    measured that metric). Missing values read ``—``; an infinite SQNR, SNR or
    PSNR (output identical to fp32) reads ``exact``; ``error`` is empty for
    configurations that ran.

    Args:
        run: a run dict as the store returns it.
    """
    configs = _configs(run)
    metric_columns = [col for col in _METRIC_COLUMNS if _has_metric(configs, col[2])]
    rows = []
    for config in configs:
        metrics = _metrics(config)
        lat = _latency(config)
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
            "config": _text(config.get("name")),
            "batch": _text(config.get("batch")),
            "status": _text(config.get("status")),
            "policy": _policy_name(config),
            "latency": latency,
            "ci": ci,
            "speedup": _fmt_with("{:.2f}x")(metrics.get("speedup")),
            "throughput": _fmt_sig(" items/s")(metrics.get("throughput_items_per_s")),
        }
        for key, _, metric, fmt in metric_columns:
            row[key] = fmt(metrics.get(metric))
        row["error"] = _error_summary(config.get("error"))
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- plots


@contextmanager
def _figure(width: float, height: float) -> Iterator[Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    try:
        yield fig
    finally:
        fig.clear()


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    # No "Software" text chunk: the bytes depend on the data alone.
    fig.canvas.print_png(buffer, metadata={"Software": None})
    return buffer.getvalue()


def _plain(text: Any, limit: int = 40) -> str:
    """A string matplotlib draws literally (no mathtext), shortened to ``limit``."""
    value = _text(text)
    if len(value) > limit:
        value = value[: limit - 1] + "…"
    return value.replace("$", r"\$")


def _no_data(fig: Any, message: str) -> None:
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=11, color="#555555")


def _scatter(fig: Any, run: Mapping[str, Any], configs: Sequence[Mapping[str, Any]], batch: Any) -> None:
    key = main_quality_key(run)
    title = f"{_plain(run.get('pipeline'))} · batch {_plain(batch)}: latency vs {QUALITY_LABELS[key]}"
    points, skipped = [], []
    for config in configs:
        lat = _latency(config)
        y = _num(_metrics(config).get(key))
        if lat is None or y is None or math.isnan(y):
            skipped.append(_plain(config.get("name"), 24))
            continue
        points.append((config, lat, y))
    if not points:
        _no_data(fig, "no configuration has both a latency and a quality measurement")
        fig.suptitle(title, fontsize=11)
        return

    finite = [y for _, _, y in points if math.isfinite(y)]
    if finite:
        low, high = min(finite), max(finite)
        span = max(high - low, abs(high) * 0.1, 1.0)
    else:
        low, high, span = 0.0, 0.0, 1.0
    top, bottom = high + 0.25 * span, low - 0.25 * span

    def shown(y: float) -> float:
        return top if y == math.inf else bottom if y == -math.inf else y

    xs = [lat["median"] for _, lat, _ in points]
    ys = [shown(y) for _, _, y in points]
    lower = [max(lat["median"] - (lat["ci_low"] if lat["ci_low"] is not None else lat["median"]), 0.0)
             for _, lat, _ in points]
    upper = [max((lat["ci_high"] if lat["ci_high"] is not None else lat["median"]) - lat["median"], 0.0)
             for _, lat, _ in points]
    front = pareto_front([(x, y) for x, (_, _, y) in zip(xs, points)])

    ax = fig.add_subplot()
    ax.errorbar(xs, ys, xerr=[lower, upper], fmt="o", color="#1f77b4", ecolor="#7fa7c9", elinewidth=1,
                capsize=3, markersize=6, label="configuration (median, CI)", zorder=3)
    order = sorted(front, key=lambda i: (xs[i], ys[i]))
    ax.plot([xs[i] for i in order], [ys[i] for i in order], "-", color="#ff7f0e", linewidth=1.5,
            label="Pareto front", zorder=2)
    ax.scatter([xs[i] for i in order], [ys[i] for i in order], s=150, facecolors="none",
               edgecolors="#ff7f0e", linewidths=1.8, zorder=4)
    for (config, _, y), x, ys_i in zip(points, xs, ys):
        label = _plain(config.get("name"), 28) + (" (exact)" if y == math.inf else "")
        ax.annotate(label, (x, ys_i), xytext=(6, 5), textcoords="offset points", fontsize=8)
    if any(y == math.inf for _, _, y in points):
        ax.axhline(top, color="#999999", linestyle=":", linewidth=1)
        ax.annotate("exact (identical to fp32)", (0.01, top), xycoords=("axes fraction", "data"),
                    xytext=(0, 3), textcoords="offset points", ha="left", va="bottom", fontsize=8, color="#666666")
    if any(y == -math.inf for _, _, y in points):
        ax.axhline(bottom, color="#999999", linestyle=":", linewidth=1)
        ax.annotate("-inf", (0.01, bottom), xycoords=("axes fraction", "data"), xytext=(0, 3),
                    textcoords="offset points", ha="left", va="bottom", fontsize=8, color="#666666")
    positive = [x for x in xs if x > 0]
    if positive and len(positive) == len(xs) and max(positive) / min(positive) > 20:
        ax.set_xscale("log")
    ax.margins(x=0.15, y=0.12)
    ax.set_xlabel("median latency (s)")
    ax.set_ylabel(QUALITY_LABELS[key] + "  (higher is better)")
    ax.grid(True, alpha=0.3)
    if not finite:
        ax.set_yticks([])  # only capped values: the axis has no scale
    ax.legend(loc="best", fontsize=8)
    if skipped:
        ax.set_title("not plotted (no latency or no quality value): " + ", ".join(skipped), fontsize=8, color="#666666")
    fig.suptitle(title, fontsize=11)


def _memory(fig: Any, configs: Sequence[Mapping[str, Any]]) -> None:
    shown = [c for c in configs if _has_metric([c], "weight_bytes") or _has_metric([c], "peak_mem_bytes")]
    if not shown:
        _no_data(fig, "no memory measurements")
        return
    ax = fig.add_subplot()
    positions = list(range(len(shown)))
    width = 0.38
    for offset, metric, label, color in ((-width / 2, "weight_bytes", "weights", "#2ca02c"),
                                         (width / 2, "peak_mem_bytes", "peak memory", "#9467bd")):
        heights = [(_num(_metrics(c).get(metric)) or 0.0) / 2**20 for c in shown]
        ax.bar([p + offset for p in positions], heights, width, label=label, color=color)
    ax.set_xticks(positions, [_plain(c.get("name"), 20) for c in shown], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("MiB")
    ax.set_title("weights and peak memory per configuration", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.margins(y=0.18)
    ax.legend(fontsize=8, loc="upper left", ncols=2)


def _distributions(fig: Any, configs: Sequence[Mapping[str, Any]]) -> None:
    data, names = [], []
    for config in configs:
        samples = [s for s in (_num(x) for x in config.get("samples") or []) if s is not None and math.isfinite(s)]
        if samples:
            data.append(samples)
            names.append(_plain(config.get("name"), 20))
    if not data:
        _no_data(fig, "no latency samples")
        return
    in_ms = max(max(d) for d in data) < 1.0
    scale = 1e3 if in_ms else 1.0
    ax = fig.add_subplot()
    ax.boxplot([[s * scale for s in d] for d in data], widths=0.5)
    ax.set_xticks(range(1, len(data) + 1), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("latency (ms)" if in_ms else "latency (s)")
    ax.set_title("latency samples per configuration", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)


def _plot_png(draw: Callable[[Any], None], width: float = 7.5, height: float = 4.6) -> bytes:
    with _figure(width, height) as fig:
        draw(fig)
        return _png(fig)


def main_plot_png(run: Mapping[str, Any], *, batch: int | None = None) -> bytes:
    """The latency-vs-quality scatter of one run, as PNG bytes.

    Args:
        run: a run dict as the store returns it.
        batch: which batch size to plot; by default the first one in the run.

    Raises:
        ValueError: ``batch`` names a batch size the run does not have.
    """
    batches = _batches(run)
    if batch is None:
        batch = batches[0] if batches else None
    elif batch not in batches:
        raise ValueError(f"run {run.get('id')} has no batch {batch!r}; its batches: {', '.join(map(str, batches)) or 'none'}")
    return _plot_png(lambda fig: _scatter(fig, run, _group(run, batch), batch))


# --------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { border-bottom: 2px solid #ddd; padding-bottom: .2em; margin-top: 2em; }
h3 { margin-top: 1.5em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .88em; }
th, td { border: 1px solid #ddd; padding: .25em .55em; vertical-align: top; }
th { background: #f4f4f4; text-align: left; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
td.err { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: .9em; color: #8b0000; max-width: 32em; }
tr.failed td, tr.timeout td { background: #fff0f0; }
tr.running td, tr.pending td { background: #fffbe6; }
.wide { overflow-x: auto; }
.banner { background: #fff4ce; border: 1px solid #e0c060; padding: .5em .8em; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; } .plots figure { flex: 1 1 480px; }
figcaption, .muted { color: #666; font-size: .88em; }
code { font-size: .9em; }
"""

_TEXT_COLUMNS = {"config", "status", "policy", "error"}


def _e(value: Any) -> str:
    return html.escape(_text(value), quote=True)


def _img(png: bytes, alt: str) -> str:
    return f'<img src="data:image/png;base64,{b64encode(png).decode("ascii")}" alt="{_e(alt)}">'


def _kv_table(pairs: Sequence[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in pairs if v not in (None, "", []))
    return f'<table class="kv">{body}</table>' if body else '<p class="muted">not recorded</p>'


def _dtype_summary(dtypes: Any) -> str:
    if not isinstance(dtypes, Mapping):
        return ""
    parts = []
    for name, info in dtypes.items():
        if isinstance(info, Mapping):
            ratio = _num(info.get("ratio"))
            klass = _text(info.get("klass")) or "?"
            parts.append(f"{name} {klass}" + (f" ({ratio:.3g}x fp32)" if ratio is not None else ""))
        else:
            parts.append(f"{name} {info}")
    return ", ".join(parts)


def _machine_html(run: Mapping[str, Any]) -> str:
    machine = run.get("machine") or {}
    memory = _num(machine.get("memory_bytes"))
    pairs = [
        ("device type", machine.get("device_type")),
        ("device", machine.get("name")),
        ("threads", machine.get("threads")),
        ("memory", f"{memory / 2**30:.1f} GiB" if memory is not None else None),
        ("compute capability", machine.get("capability")),
        ("measured dtypes", _dtype_summary(machine.get("dtypes"))),
    ]
    versions = run.get("versions") or {}
    parts = ["<h3>Machine</h3>", _kv_table(pairs)]
    flags = machine.get("cpu_flags")
    if flags:
        parts.append(f"<details><summary>CPU flags ({len(flags)})</summary><p><code>"
                     f"{_e(' '.join(map(str, flags)))}</code></p></details>")
    parts += ["<h3>Versions</h3>", _kv_table([(k, v) for k, v in versions.items()])]
    if run.get("command"):
        parts.append(f"<p>Command: <code>{_e(run['command'])}</code></p>")
    return "\n".join(parts)


def _table_html(rows: Sequence[Mapping[str, str]]) -> str:
    if not rows:
        return '<p class="muted">no configurations</p>'
    labels = dict(COLUMNS)
    keys = [k for k in rows[0] if any(r.get(k) for r in rows)]
    head = "".join(f"<th>{_e(labels.get(k, k))}</th>" for k in keys)
    body = []
    for row in rows:
        cells = []
        for key in keys:
            css = "err" if key == "error" else "text" if key in _TEXT_COLUMNS else "num"
            cells.append(f'<td class="{css}">{_e(row.get(key, ""))}</td>')
        body.append(f'<tr class="{_e(row.get("status", ""))}">{"".join(cells)}</tr>')
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def _policies_html(configs: Sequence[Mapping[str, Any]]) -> str:
    items = []
    for config in configs:
        policy = config.get("policy")
        if not isinstance(policy, Mapping):
            continue
        rules = policy.get("rules") or []
        rule_rows = []
        for rule in rules:
            if not isinstance(rule, Mapping):
                continue
            settings = ", ".join(f"{k}={v}" for k, v in rule.items() if k not in ("match", "reason"))
            rule_rows.append(f"<tr><td><code>{_e(rule.get('match'))}</code></td><td>{_e(settings)}</td>"
                             f"<td>{_e(rule.get('reason'))}</td></tr>")
        numerics = policy.get("numerics")
        numerics_text = ", ".join(f"{k}={v}" for k, v in numerics.items()) if isinstance(numerics, Mapping) else ""
        table = (f"<table><thead><tr><th>match</th><th>settings</th><th>reason</th></tr></thead>"
                 f"<tbody>{''.join(rule_rows)}</tbody></table>" if rule_rows else '<p class="muted">no rules</p>')
        items.append(f"<h4>{_e(config.get('name'))} (batch {_e(config.get('batch'))}): policy "
                     f"<code>{_e(policy.get('name'))}</code></h4>"
                     + (f"<p>numerics: <code>{_e(numerics_text)}</code></p>" if numerics_text else "") + table)
    if not items:
        return ""
    return f"<details><summary>Policies ({len(items)})</summary>{''.join(items)}</details>"


def _batch_html(run: Mapping[str, Any], batch: Any, anchor: str) -> str:
    configs = _group(run, batch)
    key = main_quality_key(run)
    name = _text(run.get("pipeline"))
    scatter = _plot_png(lambda fig: _scatter(fig, run, configs, batch))
    memory = _plot_png(lambda fig: _memory(fig, configs), 6.0, 4.0)
    spread = _plot_png(lambda fig: _distributions(fig, configs), 6.0, 4.0)
    sub_run = dict(run, configs=configs)
    return "\n".join([
        f'<h3 id="{_e(anchor)}">{_e(name)}, batch {_e(batch)}</h3>',
        f"<figure>{_img(scatter, f'{name}: latency vs quality')}<figcaption>Median latency (error bars: "
        f"confidence interval of the median) against {_e(QUALITY_LABELS[key])}; the line joins the Pareto "
        f"front (no other configuration is both faster and more accurate). Outputs identical to fp32 are "
        f"drawn above the others and labelled exact.</figcaption></figure>",
        '<div class="plots">',
        f"<figure>{_img(memory, f'{name}: memory')}<figcaption>Weight bytes and peak memory.</figcaption></figure>",
        f"<figure>{_img(spread, f'{name}: latency samples')}<figcaption>Latency samples.</figcaption></figure>",
        "</div>",
        _table_html(render_table_rows(sub_run)),
    ])


def _run_html(run: Mapping[str, Any], index: int) -> str:
    run_id = run.get("id", index)
    anchor = f"run-{run_id}"
    heading = f"Run {run_id}: {_text(run.get('pipeline'))}"
    if run.get("size"):
        heading += f" ({_text(run.get('size'))})"
    parts = [f'<section id="{_e(anchor)}">', f"<h2>{_e(heading)}</h2>"]
    times = f"started {_text(run.get('started')) or '?'}"
    times += f", finished {_text(run['finished'])}" if run.get("finished") else ", not finished"
    parts.append(f'<p class="muted">{_e(times)}; status {_e(run.get("status"))}</p>')
    if run.get("status") not in (None, "complete"):
        parts.append('<p class="banner">This run did not complete: it shows what was measured before it stopped.</p>')
    parts.append(_machine_html(run))
    batches = _batches(run)
    if not batches:
        parts.append('<p class="muted">no configurations were measured</p>')
    for i, batch in enumerate(batches):
        parts.append(_batch_html(run, batch, f"{anchor}-batch-{i}"))
    parts.append(_policies_html(_configs(run)))
    notes = run.get("notes") or []
    if notes:
        items = "".join(f"<li>{_e(note)}</li>" for note in notes)
        parts.append(f"<h3>Notes</h3><ul>{items}</ul>")
    parts.append("</section>")
    return "\n".join(p for p in parts if p)


def render_html(runs: Sequence[Mapping[str, Any]], *, title: str = "mixprec benchmark") -> str:
    """One self-contained HTML page for one or more runs.

    Per run: machine and versions; per batch size a latency-vs-quality scatter
    with its Pareto front, memory bars, latency box plots and the configuration
    table; the policies; the notes. CSS is inline and the plots are embedded as
    base64 PNG, so the page loads nothing from elsewhere. All text from the runs
    is HTML-escaped. The same runs always give the same page.

    Args:
        runs: run dicts as the store returns them.
        title: page title and heading.
    """
    runs = list(runs)
    nav = ""
    if len(runs) > 1:
        links = "".join(f'<li><a href="#run-{_e(r.get("id", i))}">Run {_e(r.get("id", i))}: {_e(r.get("pipeline"))}</a></li>'
                        for i, r in enumerate(runs))
        nav = f"<nav><ul>{links}</ul></nav>"
    body = "\n".join(_run_html(run, i) for i, run in enumerate(runs)) or '<p class="muted">no runs</p>'
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{_e(title)}</title>\n'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">\n<style>{_CSS}</style>\n</head>\n'
        f"<body>\n<h1>{_e(title)}</h1>\n{nav}\n{body}\n</body>\n</html>\n"
    )


def save_html(runs: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write :func:`render_html` of ``runs`` to ``path`` (UTF-8) and return the path."""
    target = Path(path)
    target.write_text(render_html(runs), encoding="utf-8")
    return target


# --------------------------------------------------------------------------- exports

_ROW_FIELDS = ("run_id", "pipeline", "size", "run_status", "started", "finished", "device", "torch",
               "config", "batch", "status", "error", "policy_name", "n_samples")


def _metric_names(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    present = {name for run in runs for config in _configs(run) for name in _metrics(config)}
    known = [name for name in METRIC_ORDER if name in present]
    return known + sorted(present - set(METRIC_ORDER))


def _export_rows(runs: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    names = _metric_names(runs)
    rows = []
    for run in runs:
        machine = run.get("machine") or {}
        versions = run.get("versions") or {}
        for config in _configs(run):
            metrics = _metrics(config)
            policy = config.get("policy")
            row: dict[str, Any] = {
                "run_id": run.get("id"),
                "pipeline": run.get("pipeline"),
                "size": run.get("size"),
                "run_status": run.get("status"),
                "started": run.get("started"),
                "finished": run.get("finished"),
                "device": machine.get("name"),
                "torch": versions.get("torch"),
                "config": config.get("name"),
                "batch": config.get("batch"),
                "status": config.get("status"),
                "error": config.get("error"),
                "policy_name": policy.get("name") if isinstance(policy, Mapping) else None,
                "n_samples": len(config.get("samples") or []),
            }
            row.update({name: metrics.get(name) for name in names})
            row["_samples"] = list(config.get("samples") or [])
            row["_policy"] = policy
            rows.append(row)
    return [*_ROW_FIELDS, *names], rows


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return _special(value) or repr(value)
    return str(value)


def to_csv(runs: Sequence[Mapping[str, Any]]) -> str:
    """One CSV row per configuration: run fields, status, error and every metric.

    Missing values are empty cells; infinities read ``inf`` / ``-inf``.
    """
    runs = list(runs)
    fields, rows = _export_rows(runs)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(fields)
    for row in rows:
        writer.writerow([_csv_cell(row[f]) for f in fields])
    return buffer.getvalue()


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return _special(value) or value
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def to_json(runs: Sequence[Mapping[str, Any]]) -> str:
    """A JSON array with one object per configuration.

    Each object has the CSV's fields plus ``samples`` (the raw latencies in
    seconds) and ``policy`` (the full policy, or ``null``). Infinities and NaN
    are the strings ``"inf"``, ``"-inf"`` and ``"nan"``, so the text is strict JSON.
    """
    runs = list(runs)
    fields, rows = _export_rows(runs)
    out = []
    for row in rows:
        item = {f: row[f] for f in fields}
        item["samples"] = row["_samples"]
        item["policy"] = row["_policy"]
        out.append(_json_safe(item))
    return json.dumps(out, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
