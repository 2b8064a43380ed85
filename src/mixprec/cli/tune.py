"""The ``tune`` command: parses the search flags, shows progress, and prints the frontier and the chosen policy."""

from __future__ import annotations

import json
import math
from typing import Annotated, Iterable, Optional

import typer

import mixprec
from mixprec._quote import quote
from mixprec.bench.runstate import error_line
from mixprec.cli._app import app
from mixprec.measure.executor import WorkerError, WorkerTimeout
from mixprec.cli._cluster import ExecutorFlag, HardwareFlag, RayAddressFlag, check_executor_flags, tune_on_cluster
from mixprec.cli._choices import bound_help, join_or, objective_values
from mixprec.cli._common import (
    MAX_REPEAT,
    MAX_SEED,
    MAX_SEEDS,
    PIPELINE_HELP,
    DbFlag,
    JsonFlag,
    MeasureDeviceFlag,
    SizeFlag,
    as_float,
    as_int,
    checked_device,
    checked_pipeline,
    console,
    err_console,
    fail,
    open_store,
    table,
    writable_path,
)
from mixprec.cli._files import Outputs
from mixprec.cli._text import clean, say

#: ``tune --objective``: each objective and what it finds.
OBJECTIVE_HELP = join_or([f"{name} ({what})" for name, what in objective_values().items()]) + "."


@app.command("tune")
def tune_cmd(
    ctx: typer.Context,
    pipeline: Annotated[str, typer.Option("--pipeline", help=PIPELINE_HELP)] = "tts",
    bound: Annotated[str, typer.Option("--bound", help=bound_help())] = "sqnr>=30",
    objective: Annotated[str, typer.Option("--objective", help=OBJECTIVE_HELP)] = "latency",
    budget: Annotated[Optional[str], typer.Option("--budget", help="Most measured evaluations (cached ones are free).")] = None,
    seeds: Annotated[str, typer.Option("--seeds", help="Number of seeds quality is measured on (worst case), or a comma-separated list.")] = "2",
    repeat: Annotated[str, typer.Option("--repeat", help="Timed runs per evaluation (median).")] = "2",
    size: SizeFlag = "default",
    device: MeasureDeviceFlag = "cpu",
    db: DbFlag = None,
    out: Annotated[Optional[str], typer.Option("--out", help="Write the chosen policy as TOML here.")] = None,
    html: Annotated[Optional[str], typer.Option("--html", help="Write the frontier and search path as HTML here.")] = None,
    as_json: JsonFlag = False,
    try_compile: Annotated[bool, typer.Option("--try-compile", help="The local search also tries compiling the components (torch.compile), kept where it measures faster.")] = False,
    fp8: Annotated[bool, typer.Option("--fp8/--no-fp8", help="With --objective memory, also try fp8 weights and find the layers that must stay 16-bit.")] = True,
    validation_seeds: Annotated[str, typer.Option("--validation-seeds", help="Held-out seeds the chosen policy must also meet the bound on: a count (3: the three seeds after the search seeds), or seeds such as 7,8,9 or 10-19; 0 disables validation.")] = "3",
    executor: ExecutorFlag = "local",
    ray_address: RayAddressFlag = None,
    hardware_spec: HardwareFlag = None,
    workers: Annotated[str, typer.Option("--workers", help="With --executor ray: evaluations measured at the same time, each candidate timed against fp32 in its own worker.")] = "2",
    worker_cpus: Annotated[str, typer.Option("--worker-cpus", help="With --executor ray: CPUs (and torch threads) each worker holds.")] = "1",
    policy: Annotated[Optional[str], typer.Option("--policy", help="Your own policy files, comma-separated: measured as candidates too, as the presets are, so the result is never worse than them; their rules that match no module are said before the search.")] = None,
    margin: Annotated[str, typer.Option("--margin", help="dB of error the search keeps below the bound, so the answer is not tuned to its edge (sqnr>=40 searches for 41 with 1); 0: none.")] = "1",
) -> None:
    """Find the fastest (or smallest) policy that meets a quality bound, by measurement.

    The search measures quality on --seeds; the chosen policy is then checked on
    --validation-seeds it never saw, and replaced by the next candidate of the frontier
    when it misses the bound there. Exit status 1 when no candidate meets the bound (the
    closest one is shown). The pipeline is built and measured on --device, which the
    stored tune run keeps.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mixprec.tuning.policies import load_policies, say_notes, unmatched_notes
    from mixprec.tuning.report import render_tune_html

    try:
        parsed = mixprec.parse_bound(bound)
        if objective not in objective_values():
            raise ValueError(f"--objective {quote(objective)}: expected {join_or(list(objective_values()))}")
        n_budget = as_int(budget, "--budget", high=MAX_REPEAT * 10) if budget is not None else None
        if n_budget is not None and n_budget < 1:
            raise ValueError(f"--budget {quote(budget)}: expected a positive number of evaluations")
        seed_list = [as_int(part, "--seeds", high=MAX_SEED) for part in seeds.split(",") if part.strip()]
        if len(seed_list) > MAX_SEEDS or (len(seed_list) == 1 and seed_list[0] > MAX_SEEDS):
            raise ValueError(f"--seeds {seeds[:60]!r}: at most {MAX_SEEDS} seeds")
        if len(seed_list) == 1:
            seed_list = list(range(seed_list[0]))
        if not seed_list or any(v < 0 for v in seed_list):
            raise ValueError(f"--seeds {quote(seeds)}: expected a count >= 1 (e.g. 2) or comma-separated seeds >= 0 (e.g. 0,1)")
        n_repeat = as_int(repeat, "--repeat", high=MAX_REPEAT)
        if n_repeat < 1:
            raise ValueError(f"--repeat {quote(repeat)}: expected at least 1")
        held_out = _validation_seeds(validation_seeds, seed_list)
        margin_db = as_float(margin, "--margin")
        if not (math.isfinite(margin_db) and margin_db >= 0):
            raise ValueError(f"--margin {quote(margin)}: expected a number of dB >= 0 (0: search to the bound itself)")
        writable_path(out, "--out")
        writable_path(html, "--html")
        if not pipeline.strip():
            raise ValueError(f"--pipeline {quote(pipeline)}: give a pipeline (see mixprec pipelines)")
        local = executor != "ray"  # on a cluster, the node's probe refuses a device it lacks
        if local:
            device = checked_device(device)
        pipeline = checked_pipeline(pipeline, size, 0, 1, device if local else None)
        policy_files = [p.strip() for p in (policy or "").split(",") if p.strip()]
        if policy is not None and not policy_files:
            raise ValueError(f"--policy {quote(policy)}: give one or more policy .toml/.json files, comma-separated")
        # the pre-run note: a user policy's rules that match no module of the pipeline
        pre_run = unmatched_notes(load_policies(policy_files), pipeline=pipeline, size=size)
        if try_compile:
            from mixprec.casting.compile import check_compiler

            check_compiler(mixprec.CompileSettings(), device == "cpu")
    except (ValueError, NotImplementedError) as exc:
        fail(exc)
    check_executor_flags(executor, ray_address, hardware_spec)
    try:
        n_workers, n_cpus = as_int(workers, "--workers"), as_float(worker_cpus, "--worker-cpus")
        if n_workers < 1 or not (math.isfinite(n_cpus) and n_cpus > 0):
            raise ValueError(f"--workers {quote(workers)} / --worker-cpus {quote(worker_cpus)}: expected at least 1 worker and a positive number of CPUs")
    except ValueError as exc:
        fail(exc)
    say_notes(pre_run, lambda note: say(err_console, ("warning:", "yellow"), f" {pipeline}: {note}"))
    store = open_store(db)
    on_cluster = tune_on_cluster(ctx, executor=executor, address=ray_address, hardware_spec=hardware_spec, workers=n_workers,
                                 worker_cpus=n_cpus, pipeline=pipeline, size=size, seeds=seed_list, repeat=n_repeat,
                                 device=device)
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=False) as bar:
        # two rows: the search (evaluations of the budget, the best so far) and the step running now
        task = bar.add_task(clean(f"{pipeline}: starting"), total=n_budget)
        work = bar.add_task("", total=None)

        def progress(event) -> None:
            search_text, step_text, done, total = _progress_rows(event, parsed.key)
            bar.update(task, completed=event.evaluations, description=clean(f"{pipeline}: {search_text}"))
            bar.update(work, completed=done, total=total, description=clean(step_text))

        try:
            result = mixprec.tune(pipeline, parsed, objective=objective, budget=n_budget, seeds=seed_list, store=store,
                                  progress=progress, size=size, repeat=n_repeat, try_compile=try_compile, fp8=fp8,
                                  validation_seeds=held_out, margin=margin_db, device=device, policies=policy_files,
                                  **on_cluster)
        except ValueError as exc:
            fail(exc)
        except (WorkerError, WorkerTimeout) as exc:  # the model itself failed in the worker: its error, in one line
            fail(f"the tuning worker stopped ({error_line(exc)}): nothing more was measured; the evaluations made "
                 "before are kept in the store")
    outputs = Outputs(err_console)
    again = "run the same mixprec tune command (its measurements are kept in the store and reused)"
    wrote_out = outputs.write_text(out, "--out", result.to_toml(), again=again)
    wrote_html = outputs.write_text(html, "--html", render_tune_html(result), again=again)
    if as_json:
        from mixprec.tuning.result import jsonable

        console.print_json(json.dumps(jsonable(result.to_dict())))
    else:
        _print_tune(result, pipeline, said=pre_run)
        if wrote_out:
            say(console, f"policy written to {out} (load it with mixprec.Policy.load, or MIXPREC_POLICY for mixprec.init)")
        if wrote_html:
            say(console, f"report written to {html}")
        if not wrote_out and out:
            say(console, "the chosen policy, to save by hand:\n", result.to_toml())
    if not result.met:
        say(err_console, ("bound not met:", "bold red"), f" no candidate meets {parsed}; the closest "
            f"({result.closest.step}) misses it by {result.miss:.4g}")
        raise typer.Exit(code=1)
    outputs.finish()


def _print_tune(result, pipeline: str, said: Iterable[str] = ()) -> None:
    """The frontier, the notes not said before the search (``said``: its pre-run note), the validation and the choice."""
    key = result.bound.key

    def q(c) -> str:
        v = c.evaluation.quality.get(key)
        return "n/a" if v is None else ("exact" if v == float("inf") else f"{v:.6g}")

    shown = list(result.frontier)
    if result.chosen not in shown:  # chosen by the side-by-side re-timing, not by its search timing
        shown = sorted([*shown, result.chosen], key=lambda c: c.index)
    import statistics

    def final(c) -> str:  # the side-by-side re-timing the choice is made on
        return f"{statistics.median(result.final[c.index]):.4f}" if result.final.get(c.index) else "-"

    rows = [[c.index, c.step, f"{c.evaluation.latency_s:.4f}", final(c), f"{c.evaluation.memory_bytes / 2**20:.1f}", q(c),
             "yes" if c.met else "no", "chosen" if c is result.chosen else ""] for c in shown]
    console.print(table(f"tune {pipeline} on {result.device}: frontier of {len(result.path)} candidates "
                        f"({result.bound}, {result.objective})",
                        ["#", "step", "search latency s", "final check s", "weights MiB", key, "meets", ""], rows))
    say(console, f"{result.evaluations} measured evaluations, {result.cached} reused from the store, {result.wall_s:.0f} s")
    said = set(said)
    for note in result.notes:
        if note not in said:
            say(console, "  note: ", note)
    from mixprec.tuning.report import validation_text

    say(console, f"validation: {validation_text(result)}")
    if result.seed_summary:
        rows = [[metric, _fmt_metric(v["worst"]), _fmt_metric(v["median"]), _fmt_metric(v["spread"]), int(v["seeds"])]
                for metric, v in result.seed_summary.items()]
        console.print(table("how sure: the chosen policy's quality over every seed measured",
                            ["metric", "worst", "median", "spread", "seeds"], rows))
    if result.met:
        base = result.path[0].evaluation
        chosen = result.chosen.evaluation
        weights = f"{chosen.memory_bytes / base.memory_bytes:.0%} of fp32" if base.memory_bytes else "none (the model holds no weights)"
        say(console, f"chosen: #{result.chosen.index} ({result.chosen.step}): {result.speed_text()}, "
            f"weights {weights}, {key} {q(result.chosen)}; "
            f"kept fp32: {', '.join(result.keep_fp32) or 'none'}")


def _progress_rows(event, key: str) -> tuple[str, str, int, int | None]:
    """The progress rows of a tune event: the search's text, the running step's text, and its done/total
    (total ``None``: not counted, shown as a pulsing bar)."""
    from mixprec.diagnose.progress import duration_text

    best = event.best
    best_text = (f"best #{best.index} {best.evaluation.latency_s:.3f} s, {best.evaluation.memory_bytes / 2**20:.1f} MiB, "
                 f"{key} {best.evaluation.quality.get(key, float('nan')):.4g}") if best else "none meets the bound yet"
    left = f" | search: up to about {duration_text(event.left_s)} left" if event.left_s is not None else ""
    search_text = f"{event.evaluations} evaluations | {best_text}{left}"
    step = event.work
    if step is None:
        latest = event.latest
        return search_text, f"#{latest.index} {latest.step[:40]}: done, {latest.evaluation.latency_s:.3f} s", 1, 1
    estimate = f", about {duration_text(step.left_s)} left" if step.left_s is not None else ""
    unit = f" ({step.unit})" if step.total else ""
    return search_text, f"{step.phase[:60]}{unit}{estimate}", step.done, step.total or None


def _fmt_metric(value: float) -> str:
    return "exact" if value == float("inf") else f"{value:.6g}"


def _validation_seeds(text: str, search: list[int]) -> int | list[int]:
    """``--validation-seeds``: a count (one number), or seeds and ranges (``7,8,9``, ``10-19``)."""
    from mixprec.tuning.validation import validation_seed_list

    valid = "a count (e.g. 3; 0 disables validation) or seeds such as 7,8,9 or 10-19"
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise ValueError(f"--validation-seeds {quote(text)}: expected {valid}")
    if len(parts) == 1 and "-" not in parts[0] and "," not in text:
        count = as_int(parts[0], "--validation-seeds", high=MAX_SEEDS)
        if count < 0:
            raise ValueError(f"--validation-seeds {quote(text)}: expected {valid}")
        return count
    seeds: list[int] = []
    for part in parts:
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            raise ValueError(f"--validation-seeds {quote(text)}: {quote(part)} is not a seed or a range; expected {valid}") from None
        if first < 0 or last < first or last - first > 10_000 or last > MAX_SEED:
            raise ValueError(f"--validation-seeds {quote(text)}: {quote(part)} is not a range of seeds >= 0; expected {valid}")
        seeds += range(first, last + 1)
    try:
        return list(validation_seed_list(seeds, search))
    except ValueError as exc:
        raise ValueError(f"--validation-seeds {quote(text)} vs --seeds: {exc}") from None
