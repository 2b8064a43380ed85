"""The Tune tab: search for the fastest (or smallest) policy meeting a quality bound.

:func:`tune_run` is the Start button's handler: it checks the typed values (a bad
bound shows the grammar inline and starts nothing), runs :func:`mixprec.tune` in a
background thread and yields a progress line and a growing plot of the candidates
(latency against the bound's metric), then the result, the frontier and the chosen
policy as TOML. A Cancel stops the search before its next measurement; the result
holds what was measured. :func:`run_tune` and :func:`cancel_tune` are the tab's endpoints
(see :mod:`mixprec.ui.endpoints`).

Examples:
    >>> from mixprec.ui.jobs import Job
    >>> for status, plot, summary, toml_text in tune_run("en", "minilm", "test", "cosine>=0.99", "latency", 16, "t.sqlite", Job()):
    ...     pass  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import html
import math
from typing import Any, Callable, Iterator, Sequence

import gradio as gr

import mixprec
from mixprec import pipelines
from mixprec.tuning.report import tune_plot_png
from mixprec.ui.bench_tab import speedup_text
from mixprec.ui.forms import (SIZES, cancel_job, check_choice, check_whole, devices, error_text, markdown_table, png_html,
                              status_html, store_location)
from mixprec.ui.endpoints import endpoint
from mixprec.ui.i18n import t
from mixprec.ui.jobs import Job, JobIndex
from mixprec.ui.widgets import device_picker, pipeline_pickers, run_id_box, start_cancel, store_path, wire_cancel

__all__ = ["MAX_BUDGET", "OBJECTIVES", "build_tune_tab", "cancel_tune", "objective_choices", "run_tune", "tune_cancel",
           "tune_plot_png", "tune_run"]

#: What the search minimises.
OBJECTIVES: tuple[str, ...] = ("latency", "memory")
#: Upper bound of the evaluation budget typed into the tab.
MAX_BUDGET = 10_000
_MIB = 1024 * 1024

#: One output list: status, plot, result Markdown, policy TOML.
Outputs = list[Any]


def objective_choices(lang: str) -> list[tuple[str, str]]:
    """``(label, value)`` choices of the objective radio."""
    return [(t(f"tune.objective_{name}", lang), name) for name in OBJECTIVES]


def _value(candidate: Any, key: str) -> float:
    return candidate.evaluation.quality.get(key, math.nan)


def _shown(value: float, lang: str) -> str:
    if math.isinf(value):
        return t("run.exact", lang)
    return "—" if math.isnan(value) else f"{value:.6g}"


def _plot(path: Sequence[Any], bound: mixprec.Bound, best: Any, lang: str, frontier: Sequence[Any] = ()) -> str:
    caption = t("tune.plot_caption", lang, metric=bound.key, bound=bound)
    return (png_html(tune_plot_png(path, bound, best, frontier=frontier), t("tune.plot_alt", lang, metric=bound.key),
                     "tune-plot-img")
            + f"<p>{html.escape(caption)} {html.escape(t('tune.plot_labels', lang))}</p>")


def _best_text(best: Any, bound: mixprec.Bound, lang: str) -> str:
    if best is None:
        return t("tune.best_none", lang)
    ev = best.evaluation
    return t("tune.best", lang, index=best.index, step=best.step, latency=f"{ev.latency_s * 1e3:.2f}",
             weights=f"{ev.memory_bytes / _MIB:.2f}", metric=bound.key, value=_shown(_value(best, bound.key), lang))


def _progress(event: Any, bound: mixprec.Bound, lang: str) -> str:
    """The status line: evaluations of the budget and the best so far, and while a step runs, what it is
    and how far it is (the library's own words, with its estimate of what is left)."""
    best = _best_text(event.best, bound, lang)
    budget = "∞" if event.budget is None else event.budget
    if event.work is not None:
        text = t("tune.working", lang, done=event.evaluations, budget=budget, best=best, step=event.work.text())
    else:
        text = t("tune.progress", lang, done=event.evaluations, budget=budget, best=best)
    return status_html(text, None if event.budget is None else event.evaluations / event.budget)


def _summary(result: mixprec.TuneResult, cancelled: bool, lang: str) -> str:
    key = result.bound.key
    if result.met:
        base, chosen = result.path[0].evaluation, result.chosen.evaluation
        head = t("tune.met", lang, bound=result.bound, index=result.chosen.index, step=result.chosen.step,
                 speedup=_speed(result, lang),
                 ratio=f"{100 * chosen.memory_bytes / max(base.memory_bytes, 1):.0f}", metric=key,
                 value=_shown(_value(result.chosen, key), lang))
    else:
        head = t("tune.unmet", lang, bound=result.bound, index=result.chosen.index, step=result.chosen.step,
                 miss=f"{result.miss:.4g}")
    lines = [head, "", t("tune.stats", lang, evaluations=result.evaluations, cached=result.cached,
                         seconds=f"{result.wall_s:.0f}")]
    if cancelled:
        lines += ["", t("tune.cancelled", lang)]
    lines += ["", _validation(result, lang)]
    if result.seed_summary:
        heads = [t(f"tune.col_{c}", lang) for c in ("metric", "worst", "median", "spread", "seeds")]
        table = [[metric, _shown(v["worst"], lang), _shown(v["median"], lang), _shown(v["spread"], lang), int(v["seeds"])]
                 for metric, v in result.seed_summary.items()]
        lines += ["", t("tune.summary_heading", lang), "", markdown_table(heads, table)]
    headers = [t(f"tune.col_{c}", lang) for c in ("index", "step", "latency", "weights")] + [key, t("tune.col_meets", lang)]
    rows = [[c.index, c.step, f"{c.evaluation.latency_s * 1e3:.2f}", f"{c.evaluation.memory_bytes / _MIB:.2f}",
             _shown(_value(c, key), lang), t("diag.yes" if c.met else "diag.no", lang)] for c in result.frontier]
    return "\n".join(lines + ["", t("tune.frontier_heading", lang), "", markdown_table(headers, rows)])


def _speed(result: mixprec.TuneResult, lang: str) -> str:
    """The chosen policy's speed against fp32 as every table shows it: from the side-by-side
    re-timing's paired rounds, else (search medians taken at different moments) undecided."""
    speed, value = result.speed, result.speedup
    if result.chosen.index == 0 or speed is None:
        return speedup_text(value, value, value, 0, lang, reference=result.chosen.index == 0)
    return speedup_text(speed.value, speed.low, speed.high, speed.n, lang, exact=speed.exact)


def _validation(result: mixprec.TuneResult, lang: str) -> str:
    """The held-out check in ``lang``: seeds, verdict, worst value and its distance to the bound."""
    search_seeds = ", ".join(map(str, result.search_seeds))
    v = result.validation
    if v is None:
        return t("tune.not_validated", lang, search_seeds=search_seeds)
    worst = v["worst"] if v["worst"] is not None else math.nan
    margin = t("tune.validation_margin", lang, margin=f"{v['margin']:.3g}") if math.isfinite(worst) else ""
    return t("tune.validated", lang, seeds=", ".join(map(str, v["seeds"])),
             verdict=t("tune.validation_meets" if v["met"] else "tune.validation_misses", lang), bound=result.bound,
             metric=result.bound.key, value=_shown(worst, lang), margin=margin, search_bound=result.search_bound,
             margin_db=f"{result.margin_db:g}", search_seeds=search_seeds)


def _check(lang: str, pipeline: str, size: str, bound: str, objective: str, budget: Any,
           device: str) -> tuple[tuple[mixprec.Bound, int] | None, str | None]:
    problem = (check_choice(pipeline, pipelines.available(), "run.pipeline_label", lang)
               or check_choice(size, SIZES, "run.size_label", lang)
               or check_choice(objective, OBJECTIVES, "tune.objective_label", lang)
               or check_choice(device, devices(), "tune.device_label", lang))
    if problem:
        return None, problem
    try:
        parsed = mixprec.parse_bound(bound or "")
    except ValueError as exc:
        return None, t("tune.error_bound", lang, message=str(exc))
    n_budget, problem = check_whole(budget, "tune.budget_label", lang, low=1, high=MAX_BUDGET)
    if problem:
        return None, problem
    return (parsed, n_budget), None


def tune_run(lang: str, pipeline: str, size: str, bound: str, objective: str, budget: Any, path: str | None, job: Job,
             *, seeds: Sequence[int] = (0, 1), repeat: int = 1, device: str = "cpu") -> Iterator[Outputs]:
    """The Start button: tune ``pipeline`` for ``bound`` on ``device`` (one of :func:`~mixprec.ui.forms.devices`)
    and stream the search; the stored tune run keeps the device.

    Yields:
        ``[status HTML, plot HTML, result Markdown, policy TOML]``; values that did
        not change are ``gr.update()``. Invalid input yields one inline message and
        starts nothing.
    """
    from mixprec.bench.store import Store

    keep = gr.update()
    checked, problem = _check(lang, pipeline, size, bound, objective, budget, device)
    if checked is None:
        yield [status_html(problem or ""), keep, keep, keep]
        return
    parsed, n_budget = checked
    if job.running:
        yield [status_html(t("job.busy", lang)), keep, keep, keep]
        return
    try:
        where = store_location(path)
    except ValueError as exc:  # a store the server does not allow: nothing starts
        yield [status_html(error_text("tune.failed", lang, exc)), keep, keep, keep]
        return

    def target(report: Callable[[Any], None]) -> mixprec.TuneResult:
        def progress(event: Any) -> None:
            report(dataclasses.replace(event, path=list(event.path)))

        with Store(where) as store:
            return mixprec.tune(pipeline, parsed, objective=objective, budget=n_budget, size=size, seeds=tuple(seeds),
                                repeat=repeat, store=store, progress=progress, should_stop=job.should_stop, device=device)

    for kind, value in job.stream(target):
        if kind == "started":
            yield [status_html(t("tune.starting", lang), 0.0), "", "", ""]
        elif kind == "progress":
            # a new candidate redraws the plot; the events of a running step change the status only
            plot = keep if value.work is not None else _plot(value.path, parsed, value.best, lang)
            yield [_progress(value, parsed, lang), plot, keep, keep]
        elif kind == "error":
            text = t("tune.cancelled_empty", lang) if job.should_stop() else error_text("tune.failed", lang, value)
            yield [status_html(text), keep, keep, keep]
        else:
            cancelled = job.should_stop()
            done = t("tune.done_cancelled" if cancelled else "tune.done", lang, evaluations=value.evaluations)
            yield [status_html(done, 1.0), _plot(value.path, parsed, value.chosen, lang, value.frontier),
                   _summary(value, cancelled, lang),
                   value.to_toml()]


#: The Cancel button: stop this session's search before its next measurement.
tune_cancel = cancel_job


def run_tune(lang: str, pipeline: str, size: str, bound: str, objective: str, budget: Any, path: str | None,
             device: str, job: Job) -> Iterator[Outputs]:
    """Search for the fastest (or smallest) policy meeting a quality bound, and stream the search.

    The endpoint ``run_tune``: the outputs of :func:`tune_run`, then the id of this session's
    run in progress (empty when none runs: nothing was started, or the search has ended), which
    ``cancel_tune`` takes.
    """
    for out in tune_run(lang, pipeline, size, bound, objective, budget, path, job, device=device):
        yield [*out, job.run_id or ""]


def cancel_tune(lang: str, job: Job, run_id: str | None = "") -> str:
    """Stop a search before its next measurement: the run ``run_id`` (an id ``run_tune`` returned,
    in any session) or, when it is empty, this session's search. The result holds what was measured."""
    return cancel_job(lang, job, run_id)


def build_tune_tab(lang: str, reg: Callable[..., Any], language: gr.components.Component) -> None:
    """Create the tab's components in the enclosing ``gr.Tab`` and wire them (see :func:`build_bench_tab`)."""
    job = gr.State(Job(JobIndex()), delete_callback=lambda j: j.cancel())  # each session: an idle copy
    with gr.Row():
        pipe, size = pipeline_pickers(reg, lang, "tune")
    with gr.Row():
        bound = reg(gr.Textbox(value="cosine>=0.999", label=t("tune.bound_label", lang), info=t("tune.bound_info", lang),
                               elem_id="tune-bound"), label="tune.bound_label", info="tune.bound_info")
        objective = reg(gr.Radio(objective_choices(lang), value=OBJECTIVES[0], label=t("tune.objective_label", lang),
                                 info=t("tune.objective_info", lang), elem_id="tune-objective"),
                        label="tune.objective_label", info="tune.objective_info", choices=objective_choices)
        budget = reg(gr.Number(20, precision=0, minimum=1, maximum=MAX_BUDGET, label=t("tune.budget_label", lang),
                               info=t("tune.budget_info", lang), elem_id="tune-budget"),
                     label="tune.budget_label", info="tune.budget_info")
        device = device_picker(reg, lang, "tune", label="tune.device_label", info="tune.device_info")
    path = store_path(reg, lang, "tune")
    start, cancel, status = start_cancel(reg, lang, "tune", start_key="tune.start_button", start_id="tune-start")
    run_id = run_id_box(reg, lang, "tune")
    plot = gr.HTML(elem_id="tune-plot")
    summary = gr.Markdown(elem_id="tune-summary")
    toml_text = reg(gr.Code(language=None, lines=12, max_lines=40, wrap_lines=True, label=t("tune.policy_label", lang), elem_id="tune-policy"),
                    label="tune.policy_label")

    wire_cancel(start, run_tune, cancel, job, inputs=[language, pipe, size, bound, objective, budget, path, device, job],
                outputs=[status, plot, summary, toml_text, run_id], show_progress="hidden", **endpoint("run_tune"))
    cancel.click(cancel_tune, inputs=[language, job, run_id], outputs=status, show_progress="hidden",
                 **endpoint("cancel_tune"))
