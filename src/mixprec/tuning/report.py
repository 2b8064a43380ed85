"""A :class:`~mixprec.tuning.result.TuneResult` for people: the candidates plot
(:func:`tune_plot_png`), the held-out check in one sentence (:func:`validation_text`) and a
self-contained HTML page (:func:`render_tune_html`).
"""

from __future__ import annotations

import math
import statistics
from typing import Mapping, Sequence

from mixprec.tuning.bounds import Bound
from mixprec.tuning.candidates import Candidate
from mixprec.tuning.result import TuneResult

__all__ = ["label_offsets", "plot_limits", "render_tune_html", "tune_plot_png", "validation_text"]


#: Plot colours: meets the bound, misses it, the chosen / best ring, the bound line.
_MET, _MISSED, _BEST, _BOUND = "#2a9d8f", "#e76f51", "#264653", "#e9c46a"


def tune_plot_png(path: Sequence[Candidate], bound: Bound, best: Candidate | None = None, *,
                  frontier: Sequence[Candidate] = (), legend: bool = False) -> bytes:
    """Candidates as points (latency in ms against the bound's metric), as PNG bytes.

    Green meets the bound, red misses it, the grey line is the search path, squares
    mark ``frontier``, the ring marks ``best`` and the dashed line is the bound. An
    infinite value (output identical to fp32) is drawn above the highest finite one;
    NaN is left out. Without ``legend`` the image holds numbers and the metric name
    only, so a caller can explain it in any language.
    """
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def value(c: Candidate) -> float:
        return c.evaluation.quality.get(bound.key, math.nan)

    low, high, cap = plot_limits([value(c) for c in path], bound.value)
    bound_shown = low <= bound.value <= high
    points = {c.index: (c.evaluation.latency_s * 1e3, cap if math.isinf(value(c)) else value(c))
              for c in path if not math.isnan(value(c))}
    fig = Figure(figsize=(7, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_ylim(low, high)
    shown = [c for c in path if c.index in points]
    if shown:
        xs, ys = zip(*(points[c.index] for c in shown))
        ax.plot(xs, ys, color="#cccccc", linewidth=0.8, zorder=1, label="search path")
        ax.scatter(xs, ys, s=28, zorder=2, c=[_MET if c.met else _MISSED for c in shown])
        x_low, x_high = min(xs), max(xs)
        # Latencies an order of magnitude apart (one slow candidate) on a log axis, so the rest do not bunch up.
        log_x = x_low > 0 and x_high / x_low > 8
        if log_x:
            ax.set_xscale("log")
            xlim = (x_low / 1.25, x_high * 1.25)
        else:
            pad = max((x_high - x_low) * 0.08, x_high * 0.02, 1e-3)
            xlim = (x_low - pad, x_high + pad)
        ax.set_xlim(*xlim)
        # Labelled first, so they win a crowded spot: the chosen one, the frontier, then the search order.
        wanted = ([best.index] if best is not None else []) + [c.index for c in frontier] + [c.index for c in shown]
        order = list(dict.fromkeys(i for i in wanted if i in points))
        placed = label_offsets({i: ((math.log10(points[i][0]) if log_x else points[i][0]), points[i][1]) for i in order},
                               tuple(map(math.log10, xlim)) if log_x else xlim, (low, high))
        for index, offset in placed.items():
            ax.annotate(str(index), points[index], fontsize=7, xytext=offset, textcoords="offset points")
    front = [points[c.index] for c in frontier if c.index in points]
    if front:
        ax.scatter(*zip(*front), marker="s", s=70, facecolors="none", edgecolors="black", linewidths=1, zorder=3,
                   label="frontier (latency, memory, quality)")
    if best is not None and best.index in points:
        ax.scatter(*points[best.index], s=220, facecolors="none", edgecolors=_BEST, linewidths=2, zorder=3,
                   label="chosen")
    if bound_shown:
        ax.axhline(bound.value, color=_BOUND, linewidth=1.2, linestyle="--", zorder=0, label=str(bound))
    else:  # far from every candidate: named at the edge it lies beyond, so the candidates keep the height
        below = bound.value < low
        ax.annotate(f"{bound} {'↓' if below else '↑'}", (0.01, 0.02 if below else 0.98), xycoords="axes fraction",
                    va="bottom" if below else "top", fontsize=8, color="#8a6d00")
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.set_xlabel("ms")
    ax.set_ylabel(bound.key)
    if legend:
        ax.legend(fontsize=7)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    fig.clear()
    return buffer.getvalue()


def plot_limits(values: Sequence[float], bound: float) -> tuple[float, float, float]:
    """The y range of the plot, and where an infinite value (output identical to fp32) is drawn.

    The range spans the finite values with a margin of a tenth of their span on each side (not of
    the values themselves: cosines of 0.9995 and 0.9999 would otherwise share one pixel row under a
    line drawn at 1.1), and the bound too unless it lies more than three such spans away (then the
    plot names it at its edge instead of squeezing every candidate against the other one). Infinite
    values sit in the top margin; NaN is left out.

    Returns:
        ``(low, high, cap)`` with ``low < every finite value < cap < high``; the bound lies in
        ``[low, high]`` when it is near the values.
    """
    finite = [v for v in values if math.isfinite(v)]
    if finite:
        near = max(max(finite) - min(finite), abs(max(finite)) * 1e-4, 1e-9) * 3
        if min(finite) - near <= bound <= max(finite) + near:
            finite.append(bound)
    else:
        finite = [bound]
    bottom, top = min(finite), max(finite)
    span = top - bottom
    if span <= 0:
        span = max(abs(top) * 1e-3, 1e-6)
    # At least a few float steps of the values: a margin a tenth of a tiny span can round away.
    margin = max(span * 0.1, 8 * math.ulp(max(abs(top), abs(bottom))))
    cap = top + 1.5 * margin
    return bottom - margin, cap + margin, cap


def label_offsets(points: Mapping[int, tuple[float, float]], xlim: tuple[float, float], ylim: tuple[float, float], *,
                  size: tuple[float, float] = (560.0, 300.0), char: tuple[float, float] = (4.5, 8.0),
                  tries: Sequence[tuple[float, float]] = ((4, 4), (4, -11), (-8, 4), (-8, -11), (10, -4), (-14, -4)),
                  ) -> dict[int, tuple[float, float]]:
    """Where each point's number goes, in points from the point, so that no two labels overlap.

    Points are labelled in the order given (put the important ones first); a label that fits at
    none of ``tries`` is left out (its point stays drawn).

    Args:
        points: candidate index -> (x, y) in data units.
        xlim, ylim: the axes' limits.
        size: the axes' size in points (about that of the 7 x 4.2 inch figure's plot area).
        char: width and height of one label character in points.
        tries: offsets tried in turn.

    Returns:
        index -> offset, for the points that get a label.
    """
    def to_pt(x: float, y: float) -> tuple[float, float]:
        fx = (x - xlim[0]) / ((xlim[1] - xlim[0]) or 1.0)
        fy = (y - ylim[0]) / ((ylim[1] - ylim[0]) or 1.0)
        return fx * size[0], fy * size[1]

    boxes: list[tuple[float, float, float, float]] = []
    placed: dict[int, tuple[float, float]] = {}
    for index, (x, y) in points.items():
        px, py = to_pt(x, y)
        width, height = char[0] * len(str(index)), char[1]
        for dx, dy in tries:
            box = (px + dx, py + dy, px + dx + width, py + dy + height)
            if all(box[2] <= b[0] or b[2] <= box[0] or box[3] <= b[1] or b[3] <= box[1] for b in boxes):
                boxes.append(box)
                placed[index] = (dx, dy)
                break
    return placed


def _num(value: float) -> str:
    return "exact" if value == math.inf else f"{value:.6g}"


def validation_text(result: TuneResult) -> str:
    """One sentence on the held-out check (English; the UI has its own translations)."""
    v = result.validation
    if v is None:
        return ("Not validated: the chosen policy was measured on the search seeds "
                f"{', '.join(map(str, result.search_seeds))} only.")
    worst = v["worst"]
    seeds = ", ".join(map(str, v["seeds"]))
    head = (f"On seeds {seeds}, never used by the search, the chosen policy "
            f"{'meets' if v['met'] else 'misses'} {result.bound}: worst {result.bound.key} "
            f"{_num(worst) if worst is not None else 'n/a'}")
    if worst is not None and math.isfinite(worst):
        head += f", {v['margin']:.3g} from the bound"
    if v.get("search_worst") is not None:
        head += f" (worst on the search seeds: {_num(v['search_worst'])})"
    return (f"{head}. The search worked to {result.search_bound} ({result.margin_db:g} dB margin) on seeds "
            f"{', '.join(map(str, result.search_seeds))}; {result.validations} "
            f"polic{'y' if result.validations == 1 else 'ies'} measured on the validation seeds.")


def render_tune_html(result: TuneResult) -> str:
    """A self-contained HTML page: candidates (latency vs quality), frontier, path, chosen policy."""
    import base64
    import html

    bound = result.bound
    front = result.frontier
    png = tune_plot_png(result.path, bound, result.chosen, frontier=front, legend=True)
    image = base64.b64encode(png).decode("ascii")
    esc = html.escape

    def shown(c: Candidate) -> str:
        v = c.evaluation.quality.get(bound.key, math.nan)
        return "exact" if math.isinf(v) and v > 0 else f"{v:.6g}"

    on_front = {c.index for c in front}
    rows = "".join(
        f"<tr{' class=chosen' if c is result.chosen else ''}><td>{c.index}</td><td>{esc(c.step)}</td>"
        f"<td>{c.evaluation.latency_s * 1e3:.2f}</td><td>{c.evaluation.memory_bytes / 2**20:.1f}</td>"
        f"<td>{esc(shown(c))}</td><td>{'yes' if c.met else 'no'}</td><td>{'yes' if c.index in on_front else ''}</td>"
        f"<td>{'store' if c.cached else 'measured'}</td></tr>" for c in result.path)
    final = ""
    if result.final:
        n = max(len(v) for v in result.final.values())
        heads = "".join(f"<th>round {k + 1} ms</th>" for k in range(n))
        final_rows = "".join(
            f"<tr{' class=chosen' if i == result.chosen.index else ''}><td>{i}</td><td>{esc(result.path[i].step)}</td>"
            + "".join(f"<td>{v * 1e3:.1f}</td>" for v in seconds)
            + f"<td>{statistics.median(seconds) * 1e3:.1f}</td></tr>"
            for i, seconds in result.final.items())
        final = ("<h2>Final check: the finalists re-timed side by side</h2>"
                 f"<table><tr><th>#</th><th>step</th>{heads}<th>median ms</th></tr>{final_rows}</table>")
    status = "met" if result.met else f"not met (closest misses by {result.miss:.4g})"
    held_out = f"<h2>Validation on held-out seeds</h2><p>{esc(validation_text(result))}</p>"
    if result.seed_summary:
        summary_rows = "".join(
            f"<tr><td>{esc(metric)}</td><td>{_num(v['worst'])}</td><td>{_num(v['median'])}</td>"
            f"<td>{_num(v['spread'])}</td><td>{int(v['seeds'])}</td></tr>" for metric, v in result.seed_summary.items())
        held_out += ("<p>How sure: the chosen policy's quality over every seed it was measured on.</p>"
                     "<table><tr><th>metric</th><th>worst</th><th>median</th><th>spread</th><th>seeds</th></tr>"
                     f"{summary_rows}</table>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>mixprec tune</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:right}"
        "td:nth-child(2),th:nth-child(2){text-align:left}tr.chosen{font-weight:bold;background:#e8f4f2}"
        "pre{background:#f4f4f4;padding:1em}</style></head><body>"
        f"<h1>mixprec tune: {esc(str(bound))} ({esc(result.objective)})</h1>"
        f"<p>Bound {esc(status)}; {result.evaluations} measured evaluations, {result.cached} reused from the store, "
        f"{result.wall_s:.1f} s. Chosen: #{result.chosen.index} ({esc(result.chosen.step)}).</p>"
        + "".join(f"<p>{esc(n)}</p>" for n in result.notes)
        + f"<img alt='candidates' src='data:image/png;base64,{image}'>"
        f"{held_out}<h2>Chosen policy</h2><pre>{esc(result.to_toml())}</pre>{final}"
        "<h2>Path</h2><table><tr><th>#</th><th>step</th><th>latency ms</th><th>weights MiB</th>"
        f"<th>{esc(bound.key)}</th><th>meets</th><th>frontier</th><th>source</th></tr>{rows}</table></body></html>"
    )
