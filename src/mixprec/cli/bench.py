"""The commands that measure and compare precision configurations: ``bench``, ``runs``, ``compare`` and ``gate``."""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Annotated, Any, Iterable, Optional

import typer

import mixprec
from mixprec._quote import quote
from mixprec.cli._app import app
from mixprec.cli._cluster import (
    ExecutorFlag,
    HardwareFlag,
    RayAddressFlag,
    bench_on_cluster,
    check_executor_flags,
    compare_matrix,
)
from mixprec.cli._common import (
    MAX_BATCH,
    MAX_REPEAT,
    MAX_SEED,
    DbFlag,
    JsonFlag,
    MeasureDeviceFlag,
    SizeFlag,
    as_int,
    checked_device,
    checked_pipeline,
    console,
    err_console,
    fail,
    gib,
    int_list,
    open_store,
    table,
    writable_path,
)
from mixprec.cli._choices import config_help, pipeline_values, size_units
from mixprec.cli._clock import process_started
from mixprec.cli._files import Outputs, write_run_exports
from mixprec.cli._notes import bench_pre_run_notes, say_pre_run
from mixprec.cli._text import clean, json_text, say
from mixprec.cli._verdicts import print_compare, print_gate, rows_json

#: ``gate --memory-noise-floor``: a size, with every unit it may be given in.
MEMORY_FLOOR_HELP = ("Peak memory must also grow by more than this to fail (readings move by a few MiB between identical runs), "
                     f"e.g. 8MiB; units: {', '.join(size_units())}.")
#: ``bench --pipeline``: one or more registered names or factories.
BENCH_PIPELINE_HELP = (f"Comma-separated pipeline names ({', '.join(pipeline_values())} or a plugin's: see mixprec pipelines), "
                       "e.g. tts,diffusion, or factories module.path:factory / path/to/file.py:factory.")

_TERMINAL_COLUMNS = ("config", "batch", "status", "latency", "ci", "speedup", "throughput", "tokens_per_s", "rtf",
                     "peak_mem", "weights", "compile", "compile_cached", "snr", "psnr", "ssim", "step_sqnr", "sqnr", "token_agreement", "nonfinite",
                     "fallbacks", "error")


#: Where the terminal is narrow, the columns left out first (the HTML report and --json keep every one):
#: config, speed-up, latency, quality and errors stay longest.
_DROP_FIRST = ("Compiled from cache", "Compile", "Tokens/s", "RTF", "Throughput", "Latency CI", "Weights", "Non-finite", "Token agreement",
               "SSIM", "Step SQNR", "Fallbacks", "Batch", "Peak mem", "Status")


def _print_run(run: dict, said: Iterable[str] = ()) -> None:
    """The run as a terminal table: the headline columns (the HTML report has every metric). Notes this
    command already said (``said``: the pre-run notes and the plan) are not said again."""
    from mixprec.bench.runstate import classify
    from mixprec.bench.table import COLUMNS, render_table_rows

    state = classify(run)
    rows = render_table_rows(run)
    if not rows:
        say(console, f"run {run['id']}: {run['pipeline']}: {state.text}")
        return
    labels = dict(COLUMNS)
    keys = [k for k in _TERMINAL_COLUMNS if k in rows[0] and not (k == "sqnr" and ("snr" in rows[0] or "psnr" in rows[0]))]
    keys = [k for k in keys if k != "error" or any(r.get("error") for r in rows)]
    minmax = any("(min–max)" in r.get("ci", "") for r in rows)
    console.print(table(f"run {run['id']}: {run['pipeline']} ({state.state}) on {run['machine'].get('name')}",
                        [labels.get(k, k) for k in keys],
                        [[r[k].replace(" (min–max)", "*") if k == "ci" else r[k] for k in keys] for r in rows],
                        drop=_DROP_FIRST))
    if minmax:
        say(console, "  * too few samples for a 95% interval of the median: the range of the samples is shown", soft_wrap=False)
    said = set(said)
    for note in run.get("notes", []):
        if note not in said:
            say(console, "  note: ", note, soft_wrap=False)
    if state.warning is not None:
        say(console, ("  not a final result: ", "bold yellow"), state.text, soft_wrap=False)
    elif state.problems:
        say(console, "  ", state.text, soft_wrap=False)


@app.command()
def bench(
    pipeline: Annotated[str, typer.Option("--pipeline", help=BENCH_PIPELINE_HELP)] = "tts",
    configs: Annotated[Optional[str], typer.Option("--configs", help=config_help())] = None,
    batch: Annotated[str, typer.Option("--batch", help="Comma-separated batch sizes.")] = "1",
    repeat: Annotated[str, typer.Option("--repeat", help="Timed runs per configuration.")] = "3",
    warmup: Annotated[str, typer.Option("--warmup", help="Untimed runs first.")] = "1",
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="Seconds each configuration may spend running, per batch size (default: 20x the fp32 reference's measured time, at least 30 s; the reference itself is not timed out).")] = None,
    size: SizeFlag = "default",
    seed: Annotated[str, typer.Option("--seed", help="Seed of weights and inputs.")] = "0",
    device: MeasureDeviceFlag = "cpu",
    db: DbFlag = None,
    html: Annotated[Optional[str], typer.Option("--html", help="Write a self-contained HTML report here.")] = None,
    json_out: Annotated[Optional[str], typer.Option("--json", help="Write the runs as JSON here.")] = None,
    csv_out: Annotated[Optional[str], typer.Option("--csv", help="Write one CSV row per configuration here.")] = None,
    budget: Annotated[Optional[str], typer.Option("--budget", help="Fit the whole benchmark into this time (e.g. 6m, 360s): the fp32 reference's first run calibrates, then warm-up and timed runs (at most --warmup and --repeat) and, if needed, the pipeline's steps are chosen to fit; the choice is printed.")] = None,
    force_batch: Annotated[bool, typer.Option("--force-batch", help="Skip the check that every --batch fits in free memory.")] = False,
    compiled: Annotated[bool, typer.Option("--compile", help="Add a compiled twin (torch.compile, inductor) of every configuration; or name them: fast+compile.")] = False,
    executor: ExecutorFlag = "local",
    ray_address: RayAddressFlag = None,
    hardware_spec: HardwareFlag = None,
) -> None:
    """Measure speed, memory and quality per precision configuration, side by side.

    With --executor ray each configuration runs in a fresh actor process on a Ray
    cluster; --hardware all runs the same configurations on every hardware type of
    the cluster (one run each, in one store) and prints the hardware matrix.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from mixprec.device import hardware
    from mixprec.bench import plan
    from mixprec.bench.configs import parse_configs
    from mixprec.bench.runner import BenchOptions, run_bench
    from mixprec.bench.store import StoreError

    check_executor_flags(executor, ray_address, hardware_spec)
    try:
        batches = int_list(batch, "--batch", high=MAX_BATCH)
        n_repeat, n_warmup = as_int(repeat, "--repeat", high=MAX_REPEAT), as_int(warmup, "--warmup", high=MAX_REPEAT)
        if n_repeat < 1 or n_warmup < 0:
            raise ValueError(f"--repeat must be >= 1 and --warmup >= 0, got {n_repeat} and {n_warmup}")
        if timeout is not None and (not math.isfinite(timeout) or timeout <= 0):
            raise ValueError(f"--timeout {timeout}: must be a finite, positive number of seconds")
        run_seed = as_int(seed, "--seed", low=0, high=MAX_SEED)
        budget_s = plan.parse_budget(budget, "--budget") if budget is not None else None
        for flag, path in (("--html", html), ("--json", json_out), ("--csv", csv_out)):
            writable_path(path, flag)
        if not any(p.strip() for p in pipeline.split(",")):
            raise ValueError(f"--pipeline {quote(pipeline)}: give at least one pipeline (see mixprec pipelines)")
        if executor == "local":  # on a cluster, each node's probe refuses a device it lacks
            device = checked_device(device)
        names = [checked_pipeline(p.strip(), size, run_seed, batches[0], device) for p in pipeline.split(",") if p.strip()]
        hw = hardware.probe(device) if executor == "local" else None  # on a cluster: probed on each node
        specs, notes = parse_configs(configs, hw, compiled_twins=compiled) if hw is not None else ([], [])
        # A policy file's rules that match no module: said now and kept in the run's notes.
        unmatched = bench_pre_run_notes(specs, names, size=size, seed=run_seed)
        if any(s.compile for s in specs):
            from mixprec.casting.compile import check_compiler

            check_compiler(mixprec.CompileSettings(), device == "cpu")
    except (ValueError, NotImplementedError, mixprec.ApplyError) as exc:
        fail(exc)
    command = "mixprec bench " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "mixprec bench"
    if executor == "ray":
        cluster_ids = bench_on_cluster(address=ray_address, hardware_spec=hardware_spec, names=names, configs=configs, compiled=compiled,
                         device=device, db=db, budget_s=budget_s, html=html, json_out=json_out, csv_out=csv_out,
                         size=size, seed=run_seed, show_run=_print_run, make_options=lambda name, specs, notes, share: BenchOptions(
                             pipeline=name, configs=specs, batches=batches, repeat=n_repeat, warmup=n_warmup, timeout=timeout,
                             size=size, seed=run_seed, device=device, notes=notes, command=command, budget=share))
        with open_store(db) as store:
            _print_headlines([store.load_run(i) for i in cluster_ids])
        return
    # the pre-run note: configurations added or left out, a policy's rules that match no module
    said = say_pre_run(unmatched, notes)
    store = open_store(db)
    if max(batches) > 1 and not force_batch:
        for name in names:
            _check_batches(BenchOptions(pipeline=name, configs=specs, size=size, seed=run_seed, device=device,
                                        timeout=timeout), batches, hw)
    run_ids = []
    # The budget counts from the start of this process (starting Python and importing torch
    # included), and keeps a little for printing the tables and writing the reports.
    deadline = (process_started() + budget_s - min(REPORT_RESERVE_S, 0.05 * budget_s)) if budget_s is not None else None
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=err_console, transient=False) as bar:
        for index, name in enumerate(names):
            task = bar.add_task(clean(f"{name}: starting {len(specs)} workers"), total=_steps(len(specs), n_warmup, n_repeat) * len(batches))

            def step(description: str, n: int, task=task, name=name) -> None:
                bar.update(task, advance=n, description=clean(f"{name}: {description}"))

            def planned(batch_size: int, chosen: plan.Plan, task=task, name=name) -> None:
                say(bar.console, f"{name}: batch {batch_size}: {chosen.reason}")
                said[name].add(f"batch {batch_size}: {chosen.reason}")  # the run's note: said now, not again
                bar.update(task, total=_steps(len(specs), chosen.warmup, chosen.repeat) * len(batches))

            share = None if deadline is None else (deadline - time.monotonic()) / (len(names) - index)
            options = BenchOptions(pipeline=name, configs=specs, batches=batches, repeat=n_repeat, warmup=n_warmup,
                                   timeout=timeout, size=size, seed=run_seed, device=device, notes=notes + unmatched[name],
                                   command=command, budget=share, on_plan=planned)
            try:
                run_ids.append(run_bench(options, hw, store, progress=step))
            except StoreError as exc:  # the disk filled, or the store stayed locked: what was stored is kept
                bar.stop()
                fail(exc)
    runs = [store.load_run(i) for i in run_ids]
    for run in runs:
        _print_run(run, said=said.get(run.get("pipeline"), ()))
    outputs = Outputs(err_console)
    write_run_exports(outputs, console, runs, html=html, json_out=json_out, csv_out=csv_out)
    say(console, f"stored as run(s) {', '.join(map(str, run_ids))} in {store.path}")
    _print_headlines(runs)
    outputs.finish()
    _exit_unless_measured(runs)


def _exit_unless_measured(runs: list[dict]) -> None:
    """Exit 1, with one line, where a run measured nothing a script can use: no configuration ran, its fp32
    reference failed, or nothing was timed (the run's state, :mod:`mixprec.bench.runstate`, read from the rows)."""
    from mixprec.bench.runstate import NO_REFERENCE, NOTHING, UNTIMED, classify

    short = [(run, state) for run in runs for state in [classify(run)] if state.state in (NOTHING, NO_REFERENCE, UNTIMED)]
    if short:
        say(err_console, ("not measured:", "bold red"), " " + "; ".join(
            f"run {run['id']} ({run.get('pipeline')}) {state.state}" for run, state in short) + " (exit status 1)")
        raise typer.Exit(code=1)


def _print_headlines(runs: list[dict]) -> None:
    """The last lines: per machine, pipeline and batch, which configuration to use and how sure that is."""
    from mixprec.bench.headline import by_machine

    for machine, lines in by_machine(runs).items():
        say(console, (f"what to use on {machine}:", "bold"), soft_wrap=False)
        for text in lines:
            say(console, "  ", text, soft_wrap=False)


#: Seconds of a --budget kept for printing the tables and writing --html/--json/--csv.
REPORT_RESERVE_S = 8.0


def _steps(configs: int, warmup: int, repeat: int) -> int:
    """Progress steps of one batch size: every run, the reference's first one included."""
    return configs * (warmup + repeat) + (0 if warmup else 1)


def _check_batches(options: Any, batches: list[int], hw: Any) -> None:
    """Refuse batch sizes that cannot fit in free memory, before any run is stored.

    The fp32 reference is loaded and run once at batch 1 to measure the weights and
    the memory one item takes; every configuration's worker holds both at once.
    """
    from mixprec.bench.plan import batch_limit
    from mixprec.bench.runner import calibrate
    from mixprec.measure.executor import WorkerError, WorkerTimeout
    from mixprec.device.hardware import available_memory

    free = available_memory(options.device)
    if free is None:
        return
    say(err_console, f"{options.pipeline}: measuring the memory of one item to check --batch {max(batches)} ...")
    try:
        cal = calibrate(options, hw, batch=1)
    except (WorkerError, WorkerTimeout) as exc:
        fail(f"{options.pipeline}: the fp32 reference failed while measuring memory for --batch: {exc}")
    workers = len(options.configs)
    limit = batch_limit(cal, workers=workers, available_bytes=free)
    too_big = [b for b in batches if b > limit]
    if too_big:
        fail(f"--batch {max(too_big)}: at most {limit} fit{'s' if limit == 1 else ''} in the {gib(free)} free on this "
             f"machine for {options.pipeline} ({workers} configuration workers, each holding the weights "
             f"({gib(cal.weight_bytes)}) and about {gib(max(1 << 20, cal.peak_bytes))} per item, measured at batch 1); "
             f"use a smaller --batch, fewer --configs, or --force-batch to try anyway")


runs_app = typer.Typer(help="Benchmark runs in the store.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")


@runs_app.command("list")
def runs_list(db: DbFlag = None, as_json: JsonFlag = False) -> None:
    """Recent runs, each with its state: complete, or why its figures are not a final result."""
    from mixprec.bench.runstate import with_states

    store = open_store(db)
    rows = with_states(store.runs(), store.load_run)
    if as_json:
        console.print_json(json.dumps(rows))
        return
    if not rows:
        say(console, f"no runs in {store.path}: run mixprec bench to measure some")
        return
    console.print(table(f"runs in {store.path}", ["id", "started", "finished", "status", "state", "pipeline", "size", "device",
                                                  "configs"],
                        [[r["id"], r["started"], r["finished"], r["status"], r["state"], r["pipeline"], r["size"], r["device"],
                          r["configs"]] for r in rows], drop=("finished", "size", "device", "status")))
    for r in rows:
        if not r["final"]:
            say(console, f"  run {r['id']}: ", r["state_text"], soft_wrap=False)


@runs_app.command("show")
def runs_show(run_id: Annotated[int, typer.Argument(help="Run id.")], db: DbFlag = None,
              html: Annotated[Optional[str], typer.Option("--html", help="Also write an HTML report.")] = None,
              csv_out: Annotated[Optional[str], typer.Option("--csv", help="Also write one CSV row per configuration.")] = None,
              as_json: JsonFlag = False) -> None:
    """One run: every configuration and metric, then which configuration to use and how sure that is."""
    from mixprec.bench import export
    from mixprec.bench.store import StoreError

    try:
        writable_path(html, "--html")
        writable_path(csv_out, "--csv")
    except ValueError as exc:
        fail(exc)
    store = open_store(db)
    try:
        run = store.load_run(run_id)
    except StoreError as exc:
        fail(exc)
    outputs = Outputs(err_console)
    if as_json:
        console.print(json_text(export.to_json([run])), highlight=False, markup=False, emoji=False, soft_wrap=True)
    else:
        _print_run(run)
    write_run_exports(outputs, err_console if as_json else console, [run], html=html, csv_out=csv_out)
    if not as_json:  # the JSON records carry it as "headline"
        _print_headlines([run])
    outputs.finish()


@app.command()
def compare(run_a: Annotated[int, typer.Argument(help="Earlier run id.")], run_b: Annotated[int, typer.Argument(help="Later run id.")],
            more: Annotated[Optional[list[int]], typer.Argument(help="More runs: the hardware matrix of all of them.")] = None,
            db: DbFlag = None, as_json: JsonFlag = False,
            matrix: Annotated[bool, typer.Option("--matrix", help="Show the hardware x configuration matrix of the runs (each machine against its own fp32).")] = False) -> None:
    """Per-configuration changes from run A to run B, and which exceed the noise.

    Runs with nothing to compare (another pipeline or size, no batch or configuration in
    common) exit with status 2 and the reason (with --json, also as {"comparable": false, "reason": ...}).

    Runs measured on different machines (a --hardware run on a cluster) are also shown
    as a hardware x configuration matrix; three or more runs, or --matrix, show only that.
    """
    from mixprec.bench.gate import compare as compare_runs
    from mixprec.bench.runstate import classify
    from mixprec.bench.store import StoreError

    store = open_store(db)
    if more or matrix:
        compare_matrix(store, [run_a, run_b, *(more or [])], as_json)
        return
    try:
        runs = store.load_run(run_a), store.load_run(run_b)
        rows = compare_runs(*runs)
    except (StoreError, ValueError) as exc:
        if as_json and not isinstance(exc, StoreError):  # the runs exist but cannot be compared: say why in the JSON too
            console.print_json(json.dumps({"comparable": False, "reason": str(exc), "rows": []}))
        fail(exc)
    if as_json:
        console.print_json(rows_json(rows))
        return
    print_compare(console, run_a, run_b, rows, tuple(classify(run) for run in runs))
    compare_matrix(store, [run_a, run_b], False, only_across_machines=True)


@app.command("gate")
def gate_cmd(
    run_id: Annotated[int, typer.Argument(help="The run to check.")],
    baseline: Annotated[int, typer.Option("--baseline", help="The run to compare against.")],
    max_quality_drop: Annotated[str, typer.Option("--max-quality-drop")] = "5%",
    max_latency_regression: Annotated[str, typer.Option("--max-latency-regression")] = "10%",
    max_memory_increase: Annotated[str, typer.Option("--max-memory-increase")] = "0%",
    max_failure_rate: Annotated[str, typer.Option("--max-failure-rate", help="Fraction of configurations that may fail; a run in which every one failed always fails.")] = "1%",
    min_quality: Annotated[Optional[str], typer.Option("--min-quality", help="Absolute quality floor, e.g. 40dB: every configuration must reach it, and against an exact baseline (fp32 vs itself) it is what lets a finite quality pass.")] = None,
    memory_noise_floor: Annotated[str, typer.Option("--memory-noise-floor", help=MEMORY_FLOOR_HELP)] = "8MiB",
    fail_undecided: Annotated[bool, typer.Option("--fail-undecided", help="Fail where the timings can neither support nor exclude a latency regression (by default: a warning).")] = False,
    allow_different_machine: Annotated[bool, typer.Option("--allow-different-machine",
                                                          help="Gate against a baseline measured on another machine.")] = False,
    db: DbFlag = None,
) -> None:
    """Exit 1 and list every violation when a run regresses against a baseline (for CI).

    Latency is judged on intervals. Where they cannot tell,
    the check is listed as undecided and passes (--fail-undecided to fail it).
    Exit 2, with the reason, where the gate cannot decide: a baseline with nothing to compare
    against (it did not finish, every configuration failed, its fp32 failed, it timed nothing),
    a run that did not finish, or runs that do not compare (another pipeline, size or device).
    """
    from mixprec.bench.gate import check, thresholds_from_flags
    from mixprec.bench.store import StoreError

    try:
        thresholds = thresholds_from_flags(max_quality_drop=max_quality_drop, max_latency_regression=max_latency_regression,
                                           max_memory_increase=max_memory_increase, max_failure_rate=max_failure_rate,
                                           min_quality=min_quality, memory_noise_floor=memory_noise_floor,
                                           fail_undecided=fail_undecided)
    except ValueError as exc:
        fail(exc)
    store = open_store(db)
    try:
        result = check(store.load_run(run_id), store.load_run(baseline), thresholds,
                       allow_different_machine=allow_different_machine)
    except StoreError as exc:
        fail(exc)
    print_gate(err_console if result.unusable else console, run_id, baseline, result, fail_undecided=fail_undecided)
    if result.unusable:
        raise typer.Exit(code=2)
    if not result.passed:
        raise typer.Exit(code=1)
