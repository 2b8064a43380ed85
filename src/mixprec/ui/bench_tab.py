"""The Benchmark tab: run ``mixprec bench`` from the browser, and browse the stored runs.

:func:`bench_run` is the Run button's handler: it checks the typed values, runs
:func:`mixprec.bench.runner.run_bench` in a background thread and yields the
progress, then the table, the plot and the refreshed list of runs. A Cancel stops
the run after its current step; what was measured is kept and the run is stored as
``cancelled``. :func:`run_benchmark` and :func:`cancel_benchmark` are the tab's endpoints
(see :mod:`mixprec.ui.endpoints`): the start says its run id, which the cancel takes.

Examples:
    >>> from mixprec.ui.jobs import Job
    >>> for status, *_ in bench_run("en", "minilm", "test", ["fp32", "fast"], 3, 1, "cpu", "b.sqlite", Job()):
    ...     pass  # doctest: +SKIP
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import gradio as gr

from mixprec import pipelines
from mixprec._quote import clip
from mixprec.device import hardware
from mixprec.bench.configs import BUILTIN, CALIBRATED_SUFFIX
from mixprec.ui.forms import (SIZES, cancel_job, check_choice, check_whole, devices, error_text, markdown_table, png_html,
                              status_html, store_location)
from mixprec.ui.endpoints import endpoint
from mixprec.ui.i18n import DEFAULT_LANGUAGE, bidi, messages, t
from mixprec.ui.jobs import Job, JobIndex
from mixprec.ui.stores import runs_with_states, state_key
from mixprec.ui.widgets import device_picker, pipeline_pickers, run_id_box, start_cancel, store_path, wire_cancel

__all__ = ["CONFIGS", "DEFAULT_CONFIGS", "MAX_RUNS", "TABLE_COLUMNS", "bench_cancel", "bench_run", "build_bench_tab",
           "cancel_benchmark", "devices", "list_runs", "results_table", "run_benchmark", "show_run"]

#: Configurations offered (those of ``mixprec bench --configs``), the presets also checked on the pipeline first.
CONFIGS: tuple[str, ...] = tuple(BUILTIN) + tuple(f"{p}{CALIBRATED_SUFFIX}" for p in ("balanced", "fast", "memory"))
#: Checked at start: the reference and one preset, so a first run is quick.
DEFAULT_CONFIGS: tuple[str, ...] = ("fp32", "fast")
#: Upper bound of the timed and warm-up runs typed into the tab.
MAX_RUNS = 1000
#: Columns of the table under the Run button (the full report has every metric).
TABLE_COLUMNS: tuple[str, ...] = ("config", "status", "latency", "ci", "speedup", "peak_mem", "weights", "snr", "psnr",
                                  "sqnr", "cosine", "token_agreement", "nonfinite", "fallbacks", "error")

#: One output list: status, results table, plot, runs listing, run dropdown.
Outputs = list[Any]


def _status(value: Any, lang: str) -> str:
    """A run or configuration status in ``lang`` (unknown ones as they are)."""
    return messages(lang).get(f"bench.status_{str(value).replace(' ', '_')}", str(value))


def results_table(run: dict[str, Any], lang: str) -> str:
    """The run's headline columns as a Markdown table with translated headers."""
    from mixprec.bench.table import render_table_rows

    rows = render_table_rows(run)
    if not rows:
        return ""
    keys = [k for k in TABLE_COLUMNS if k in rows[0]]
    if "snr" in keys or "psnr" in keys:
        keys = [k for k in keys if k != "sqnr"]
    if not any(r.get("error") for r in rows):
        keys = [k for k in keys if k != "error"]
    body = [[_status(r[k], lang) if k == "status" else _speedup(r[k], lang) if k == "speedup" else r[k] for k in keys]
            for r in rows]
    table = markdown_table([t(f"bench.tcol_{k}", lang) for k in keys], body)
    # What a speed-up cell's word means is said under the table, in the table's language.
    cells = [r["speedup"] for r in rows] if "speedup" in keys else []
    notes = ["\\* " + t(f"bench.note_{word}", lang) for word in ("undecided", "unstable")
             if any(c.startswith(word) for c in cells)]
    if any(c not in ("reference", "—") for c in cells):
        notes.append(t("bench.note_paired", lang))
    # A calibrated preset: what its calibration kept, and how fast it measured (the stored policy's name says it).
    calibrated = [f"{c['name']}: {(c.get('policy') or {}).get('name')}" for c in run.get("configs") or ()
                  if str(c.get("name", "")).endswith(CALIBRATED_SUFFIX) and (c.get("policy") or {}).get("name")]
    if calibrated:
        notes.append(t("bench.note_calibrated", lang) + "".join(_calibrated_lines(line, lang) for line in calibrated))
    # What makes the figures less than certain is said beside them, as the CLI and the report do.
    doubts = [n for n in run.get("notes") or () if any(w in n for w in _DOUBTS)]
    return (table + "".join(f"\n\n{n}" for n in notes)
            + "".join(f"\n\n> {bidi(html.escape(_short(n)), lang)}" for n in doubts))


#: A per-component line of a calibrated preset's name (:meth:`mixprec.calibration.Calibration.component_lines`).
_COMPONENT_LINE = re.compile(r"^[^;:]+: \d+% of the run, ")


def _calibrated_lines(line: str, lang: str) -> str:
    """A calibrated configuration's line, its components (where it was calibrated per component) listed under it."""
    parts = line.split("; ")
    head = [p for p in parts if not _COMPONENT_LINE.match(p)]
    components = [p for p in parts if _COMPONENT_LINE.match(p)]
    return (f"\n\n- {bidi(html.escape('; '.join(head)), lang)}"
            + "".join(f"\n    - {bidi(html.escape(c), lang)}" for c in components))


def _speedup(cell: str, lang: str, *, mark: bool = True) -> str:
    """A speed-up cell (:func:`mixprec.bench.evidence.speedup_cell`) with its verdict word in ``lang``
    and (``mark``) a mark pointing to the note under the table."""
    for word in ("undecided", "unstable", "reference"):
        if cell.startswith(word):
            star = " \\*" if mark and word != "reference" else ""
            return t(f"bench.cell_{word}", lang) + cell[len(word):] + star
    return cell


def speedup_text(value: float, low: float, high: float, n: int | None, lang: str, *, exact: bool = False,
                 reference: bool = False) -> str:
    """A speed-up against fp32 outside a table (the Run and Tune tabs), as every table shows it
    (:func:`mixprec.bench.evidence.speedup_cell`: a figure only where its interval from ``n``
    paired runs supports one), its verdict word in ``lang``."""
    from mixprec.bench.evidence import Interval, speedup_cell  # numpy: loaded when a figure is shown

    return _speedup(speedup_cell(Interval(value, low, high, n, exact), reference=reference), lang, mark=False)


#: Run notes that qualify the table's figures.
_DOUBTS = ("unstable", "undecided", "behind the time budget", "the machine was loaded", "fallback ran during")


def list_runs(path: str | None, *, lang: str = DEFAULT_LANGUAGE) -> tuple[str, list[tuple[str, int]]]:
    """The runs in a benchmark store, as a Markdown table and dropdown choices.

    Args:
        path: the SQLite file; empty or ``None`` for the default location.
        lang: language of the table.
    """
    from mixprec.bench.store import Store, StoreError

    try:
        where = store_location(path)
        if not Path(where).is_file():
            return t("bench.none", lang, path=_short(where)), []
        with Store(where) as store:
            runs = runs_with_states(store)
    except (StoreError, OSError, ValueError) as exc:
        return t("bench.error", lang, message=_short(str(exc))), []
    if not runs:
        return t("bench.none", lang, path=where), []
    cols = ("id", "started", "status", "state", "pipeline", "size", "configs")
    rows = [[_status(r[c], lang) if c == "status" else t(state_key(r[c]), lang) if c == "state" else r[c] for c in cols]
            for r in runs]
    table = markdown_table([t(f"bench.col_{c}", lang) for c in cols], rows)
    if not all(r["final"] for r in runs):
        table += "\n\n" + t("bench.state_note", lang)
    choices = [(f"#{r['id']} {r['pipeline']} ({r['size']}) {r['started']}", int(r["id"])) for r in runs]
    return t("bench.found", lang, count=len(runs), path=where) + "\n\n" + table, choices


def _short(text: str, limit: int = 300) -> str:
    """A path or message clipped for display (a 100,000-character path is not echoed whole)."""
    return clip(text, limit=limit)


def show_run(path: str | None, run_id: int | None, *, lang: str = DEFAULT_LANGUAGE) -> str:
    """The HTML report of one stored run, embedded in an iframe.

    A run of a hardware matrix (``mixprec bench --executor ray --hardware ...``) is shown
    with the other runs of its matrix, under their hardware x configuration table.
    """
    from mixprec.bench.matrix import matrix_runs
    from mixprec.bench.report import render_html
    from mixprec.bench.store import Store, StoreError

    if run_id is None:
        return html.escape(t("bench.pick_first", lang))
    try:
        where = store_location(path)
        if not Path(where).is_file():  # showing never creates a store
            return html.escape(t("bench.none", lang, path=_short(where)))
        with Store(where) as store:
            page = render_html(matrix_runs(store, store.load_run(int(run_id))))
    except (StoreError, OSError, ValueError) as exc:
        return html.escape(t("bench.error", lang, message=_short(str(exc))))
    return f'<iframe id="bench-report-frame" srcdoc="{html.escape(page, quote=True)}" style="width:100%;height:900px;border:0"></iframe>'


def _check(lang: str, pipeline: str, size: str, configs: Sequence[str] | None, repeat: Any, warmup: Any,
           device: str) -> tuple[tuple[int, int] | None, str | None]:
    """``((repeat, warmup), None)`` or ``(None, the first inline message)``."""
    problem = (check_choice(pipeline, pipelines.available(), "run.pipeline_label", lang)
               or check_choice(size, SIZES, "run.size_label", lang)
               or check_choice(device, devices(), "bench.device_label", lang))
    if problem:
        return None, problem
    if not configs:
        return None, t("bench.error_configs", lang)
    for name in configs:
        if problem := check_choice(name, CONFIGS, "bench.configs_label", lang):
            return None, problem
    n_repeat, problem = check_whole(repeat, "bench.repeat_label", lang, low=1, high=MAX_RUNS)
    if problem:
        return None, problem
    n_warmup, problem = check_whole(warmup, "bench.warmup_label", lang, low=0, high=MAX_RUNS)
    if problem:
        return None, problem
    return (n_repeat, n_warmup), None


def bench_run(lang: str, pipeline: str, size: str, configs: Sequence[str] | None, repeat: Any, warmup: Any,
              device: str, path: str | None, job: Job) -> Iterator[Outputs]:
    """The Run button: benchmark ``configs`` and stream the progress, then the results.

    Yields:
        ``[status HTML, table Markdown, plot HTML, runs Markdown, run dropdown update]``;
        values that did not change are ``gr.update()``. Invalid input yields one
        inline message and starts nothing.
    """
    from mixprec.bench.configs import parse_configs
    from mixprec.bench.runner import BenchOptions, run_bench
    from mixprec.bench.store import Store

    keep = gr.update()

    def out(status: str, table: Any = keep, plot: Any = keep, runs: Any = keep, pick: Any = keep) -> Outputs:
        return [status, table, plot, runs, pick]

    checked, problem = _check(lang, pipeline, size, configs, repeat, warmup, device)
    if checked is None:
        yield out(status_html(problem or ""))
        return
    n_repeat, n_warmup = checked
    if job.running:
        yield out(status_html(t("job.busy", lang)))
        return
    try:
        where = store_location(path)  # before any work: a store the server does not allow starts nothing
        hw = hardware.probe(device)
        specs, notes = parse_configs(",".join(configs or ()), hw)
    except (ValueError, RuntimeError) as exc:
        yield out(status_html(error_text("bench.failed", lang, exc)))
        return
    command = (f"mixprec bench --pipeline {pipeline} --size {size} --configs {','.join(s.name for s in specs)} "
               f"--repeat {n_repeat} --warmup {n_warmup} --device {device} --db {where}")
    options = BenchOptions(pipeline=pipeline, configs=specs, repeat=n_repeat, warmup=n_warmup, size=size,
                           device=device, notes=notes, command=command)
    total = len(specs) * (n_warmup + n_repeat) + (0 if n_warmup else 1)

    def target(report: Callable[[Any], None]) -> int:
        done = 0

        def progress(description: str, n: int) -> None:
            nonlocal done
            done += n
            report((description, done))

        with Store(where) as store:
            return run_bench(options, hw, store, progress=progress, should_stop=job.should_stop)

    for kind, value in job.stream(target):
        if kind == "started":
            yield out(status_html(t("bench.starting", lang, count=len(specs)), 0.0), "", "")
        elif kind == "progress":
            step, done = value
            yield out(status_html(t("bench.progress", lang, done=done, total=total, step=step), done / total))
        elif kind == "error":
            yield out(status_html(error_text("bench.failed", lang, value)))
        else:
            yield _finished(lang, where, value)


def _finished(lang: str, where: str, run_id: int) -> Outputs:
    from mixprec.bench.plots import main_plot_png
    from mixprec.bench.store import Store, StoreError

    try:
        with Store(where) as store:
            run = store.load_run(run_id)
    except (StoreError, OSError) as exc:
        return [status_html(error_text("bench.failed", lang, exc))] + [gr.update()] * 4
    key = "bench.cancelled" if run["status"] == "cancelled" else "bench.finished"
    plot = png_html(main_plot_png(run), t("bench.plot_alt", lang), "bench-plot-img")
    text, choices = list_runs(where, lang=lang)
    return [status_html(t(key, lang, run_id=run_id, path=where), 1.0), results_table(run, lang), plot, text,
            gr.update(choices=choices, value=run_id)]


#: The Cancel button: stop this session's benchmark after its current step.
bench_cancel = cancel_job


def run_benchmark(lang: str, pipeline: str, size: str, configs: Sequence[str] | None, repeat: Any, warmup: Any,
                  device: str, path: str | None, job: Job) -> Iterator[Outputs]:
    """Benchmark configurations of a pipeline and stream the progress, then the results.

    The endpoint ``run_benchmark``: the outputs of :func:`bench_run`, then the id of this
    session's run in progress (empty when none runs: nothing was started, or the run has ended),
    which ``cancel_benchmark`` takes.
    """
    for out in bench_run(lang, pipeline, size, configs, repeat, warmup, device, path, job):
        yield [*out, job.run_id or ""]


def cancel_benchmark(lang: str, job: Job, run_id: str | None = "") -> str:
    """Stop a benchmark after its current step: the run ``run_id`` (an id ``run_benchmark`` returned,
    in any session) or, when it is empty, this session's run. What was measured is kept."""
    return cancel_job(lang, job, run_id)


def build_bench_tab(lang: str, reg: Callable[..., Any], language: gr.components.Component) -> None:
    """Create the tab's components in the enclosing ``gr.Tab`` and wire them.

    Args:
        lang: initial language.
        reg: registers a component's translated properties (``reg(component, label="key")``).
        language: the component holding the current language code.
    """
    job = gr.State(Job(JobIndex()), delete_callback=lambda j: j.cancel())  # each session: an idle copy
    reg(gr.Markdown(t("bench.run_heading", lang)), value="bench.run_heading")
    with gr.Row():
        pipe, size = pipeline_pickers(reg, lang, "bench")
        device = device_picker(reg, lang, "bench", label="bench.device_label", info="bench.device_info")
    configs = reg(gr.CheckboxGroup(list(CONFIGS), value=list(DEFAULT_CONFIGS), label=t("bench.configs_label", lang),
                                   info=t("bench.configs_info", lang), elem_id="bench-configs"),
                  label="bench.configs_label", info="bench.configs_info")
    with gr.Row():
        repeat = reg(gr.Number(3, precision=0, minimum=1, maximum=MAX_RUNS, label=t("bench.repeat_label", lang),
                               info=t("bench.repeat_info", lang), elem_id="bench-repeat"),
                     label="bench.repeat_label", info="bench.repeat_info")
        warmup = reg(gr.Number(1, precision=0, minimum=0, maximum=MAX_RUNS, label=t("bench.warmup_label", lang),
                               info=t("bench.warmup_info", lang), elem_id="bench-warmup"),
                     label="bench.warmup_label", info="bench.warmup_info")
    path = store_path(reg, lang, "bench")
    run_button, cancel_button, status = start_cancel(reg, lang, "bench", start_key="bench.run_button",
                                                     start_id="bench-run-button")
    run_id = run_id_box(reg, lang, "bench")
    table = gr.Markdown(elem_id="bench-table")
    plot = gr.HTML(elem_id="bench-plot")

    reg(gr.Markdown(t("bench.browse_heading", lang)), value="bench.browse_heading")
    load_button = reg(gr.Button(t("bench.load_button", lang), elem_id="bench-load"), value="bench.load_button")
    runs_md = gr.Markdown(elem_id="bench-runs")
    run_pick = reg(gr.Dropdown([], value=None, label=t("bench.run_label", lang), info=t("bench.run_info", lang),
                               elem_id="bench-run"), label="bench.run_label", info="bench.run_info")
    show_button = reg(gr.Button(t("bench.show_button", lang), elem_id="bench-show"), value="bench.show_button")
    report = gr.HTML(elem_id="bench-report")

    def listed_runs(lang: str, path: str | None) -> tuple[str, Any]:
        """The runs of a benchmark store (empty path: the default store) and the run dropdown's choices."""
        text, choices = list_runs(path, lang=lang)
        return text, gr.update(choices=choices, value=choices[0][1] if choices else None)

    def stored_run(lang: str, path: str | None, run: int | None) -> str:
        """The HTML report of the stored run ``run`` of a benchmark store."""
        return show_run(path, run, lang=lang)

    wire_cancel(run_button, run_benchmark, cancel_button, job,
                inputs=[language, pipe, size, configs, repeat, warmup, device, path, job],
                outputs=[status, table, plot, runs_md, run_pick, run_id], show_progress="hidden",
                **endpoint("run_benchmark"))
    cancel_button.click(cancel_benchmark, inputs=[language, job, run_id], outputs=status, show_progress="hidden",
                        **endpoint("cancel_benchmark"))
    load_button.click(listed_runs, inputs=[language, path], outputs=[runs_md, run_pick], **endpoint("list_runs"))
    show_button.click(stored_run, inputs=[language, path, run_pick], outputs=report, **endpoint("show_run"))
