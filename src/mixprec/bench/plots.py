"""Matplotlib figures of a run as PNG bytes: the latency-vs-quality scatter with its Pareto front, memory bars
and latency box plots. They are drawn with :class:`matplotlib.figure.Figure` on an Agg canvas, never through
``pyplot``, so the backend an application selected stays as it is; the PNG files carry no metadata."""

from __future__ import annotations

import io
import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Sequence

from mixprec._quote import few
from mixprec.bench import rundata
from mixprec.bench.runstate import unmeasured
from mixprec.measure.metrics import pareto_front

__all__ = ["QUALITY_LABELS", "latency_samples_png", "main_plot_png", "main_quality_key", "memory_png", "scatter_png"]

#: Axis labels of the quality metrics the latency/quality plot can use.
QUALITY_LABELS: dict[str, str] = {"snr_db": "SNR (dB)", "sqnr_db": "SQNR (dB)", "psnr_db": "PSNR (dB)"}


def main_quality_key(run: Mapping[str, Any]) -> str:
    """The metric a run's latency/quality plot uses.

    ``psnr_db`` for image pipelines, ``snr_db`` for audio ones, ``sqnr_db``
    otherwise (embeddings, token outputs), decided by which metrics the run holds.
    """
    configs = rundata.configs(run)
    for key in ("psnr_db", "snr_db"):
        if rundata.has_metric(configs, key):
            return key
    return "sqnr_db"


# --------------------------------------------------------------------------- drawing


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
    value = rundata.text(text)
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
        lat = rundata.latency(config)
        y = rundata.num(rundata.metrics(config).get(key))
        if lat is None or y is None or math.isnan(y) or unmeasured(config) is not None:
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
        ax.set_title("not plotted (not measured, or no latency or no quality value): " + few(skipped), fontsize=8,
                     color="#666666")
    fig.suptitle(title, fontsize=11)


def _memory(fig: Any, configs: Sequence[Mapping[str, Any]]) -> None:
    shown = [c for c in configs if rundata.has_metric([c], "weight_bytes") or rundata.has_metric([c], "peak_mem_bytes")]
    if not shown:
        _no_data(fig, "no memory measurements")
        return
    ax = fig.add_subplot()
    positions = list(range(len(shown)))
    width = 0.38
    for offset, metric, label, color in ((-width / 2, "weight_bytes", "weights", "#2ca02c"),
                                         (width / 2, "peak_mem_bytes", "peak memory", "#9467bd")):
        heights = [(rundata.num(rundata.metrics(c).get(metric)) or 0.0) / 2**20 for c in shown]
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
        samples = [s for s in (rundata.num(x) for x in config.get("samples") or []) if s is not None and math.isfinite(s)]
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


# --------------------------------------------------------------------------- PNG


def _plot_png(draw: Callable[[Any], None], width: float = 7.5, height: float = 4.6) -> bytes:
    with _figure(width, height) as fig:
        draw(fig)
        return _png(fig)


def scatter_png(run: Mapping[str, Any], configs: Sequence[Mapping[str, Any]], batch: Any) -> bytes:
    """Median latency (with its CI) against the main quality metric, and the Pareto front, of ``configs``."""
    return _plot_png(lambda fig: _scatter(fig, run, configs, batch))


def memory_png(configs: Sequence[Mapping[str, Any]]) -> bytes:
    """Weight bytes and peak memory of ``configs`` as bars."""
    return _plot_png(lambda fig: _memory(fig, configs), 6.0, 4.0)


def latency_samples_png(configs: Sequence[Mapping[str, Any]]) -> bytes:
    """The latency samples of ``configs`` as box plots."""
    return _plot_png(lambda fig: _distributions(fig, configs), 6.0, 4.0)


def main_plot_png(run: Mapping[str, Any], *, batch: int | None = None) -> bytes:
    """The latency-vs-quality scatter of one run, as PNG bytes.

    Args:
        run: a run dict as the store returns it.
        batch: which batch size to plot; by default the first one in the run.

    Raises:
        ValueError: ``batch`` names a batch size the run does not have.
    """
    batches = rundata.batches(run)
    if batch is None:
        batch = batches[0] if batches else None
    elif batch not in batches:
        raise ValueError(f"run {run.get('id')} has no batch {batch!r}; its batches: {', '.join(map(str, batches)) or 'none'}")
    return scatter_png(run, rundata.group(run, batch), batch)

