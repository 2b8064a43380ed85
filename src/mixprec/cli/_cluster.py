"""What ``bench`` and ``tune`` share to run on a Ray cluster: the flags, connecting, and the
hardware matrix printed for the terminal. The work itself is in
:mod:`mixprec.bench.distributed` and :mod:`mixprec.tuning.pool`.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Annotated, Any, Iterator, Optional

import typer

from mixprec._quote import quote
from mixprec.cli._common import console, err_console, fail, open_store, table
from mixprec.cli._files import Outputs, write_run_exports
from mixprec.cli._notes import bench_pre_run_notes, say_pre_run
from mixprec.cli._text import say

__all__ = ["ExecutorFlag", "RayAddressFlag", "HardwareFlag", "check_executor_flags", "cluster", "bench_on_cluster",
           "print_matrix"]

#: ``--executor``: where the workers run -> what that means.
EXECUTORS: dict[str, str] = {
    "local": "fresh processes on this machine",
    "ray": "fresh actor processes on a Ray cluster; needs pip install 'mixprec\\[ray]'",
}

ExecutorFlag = Annotated[str, typer.Option("--executor", help="Where the workers run: " + " or ".join(
    f"{name} ({what})" for name, what in EXECUTORS.items()) + ".")]
RayAddressFlag = Annotated[Optional[str], typer.Option("--ray-address", help="With --executor ray: auto (the cluster this machine joined), or HOST:PORT of the head node; default: a private Ray on this machine.")]
HardwareFlag = Annotated[Optional[str], typer.Option("--hardware", help="With --executor ray: all (one run per hardware type in the cluster) or LABEL[,LABEL] (nodes started with --resources '{\"mixprec-hw:LABEL\": 1}').")]


def check_executor_flags(executor: str, ray_address: str | None, hardware: str | None) -> None:
    """Refuse an unknown ``--executor`` and cluster flags without ``--executor ray`` (exit 2)."""
    if executor not in EXECUTORS:
        fail(f"--executor {quote(executor)}: expected one of {', '.join(EXECUTORS)}")
    if executor == "local":
        given = [flag for flag, value in (("--ray-address", ray_address), ("--hardware", hardware)) if value is not None]
        if given:
            fail(f"{' and '.join(given)} need{'s' if len(given) == 1 else ''} --executor ray "
                 "(the local executor runs on this machine only)")


@contextmanager
def cluster(address: str | None) -> Iterator[Any]:
    """The connected ``ray`` module; Ray missing or an address nothing answers on exit 2."""
    from mixprec.measure.cluster import ClusterError, connect
    from mixprec.measure.ray_executor import RayUnavailable

    with ExitStack() as stack:
        try:
            ray = stack.enter_context(connect(address))
        except (RayUnavailable, ClusterError) as exc:
            fail(exc)
        yield ray


def print_matrix(runs: list[dict]) -> None:
    """The hardware × configuration table of ``runs``, and who wins where."""
    from mixprec.bench.matrix import hardware_matrix, matrix_text_rows

    for matrix in hardware_matrix(runs):
        header, rows = matrix_text_rows(matrix)
        title = f"hardware matrix: {matrix.pipeline} ({matrix.size}), batch {matrix.batch}: speed-up vs each machine's own fp32"
        console.print(table(title, header, rows))
        for line in matrix.summary():
            say(console, f"  {line}")
    console.print("  * the fastest configuration on that machine: its speed-up interval lies above every other's "
                  "(none marked where the intervals cannot decide)", highlight=False, markup=False)


def bench_on_cluster(*, address: str | None, hardware_spec: str | None, names: list[str], configs: str | None,
                     compiled: bool, device: str, db: str | None, make_options: Any, budget_s: float | None,
                     html: str | None, json_out: str | None, csv_out: str | None,
                     show_run: Any = None, size: str = "default", seed: int = 0) -> list[int]:
    """``mixprec bench --executor ray``: probe the chosen hardware types, then one run per type and pipeline.

    ``make_options(name, specs, notes, budget)`` builds the :class:`~mixprec.bench.runner.BenchOptions`
    of one pipeline; ``show_run(run, said=...)`` prints each run's own table, without the notes said
    before the runs. Everything the cluster cannot do as asked exits 2 before any run is stored. A policy file's rules that match no
    module of a pipeline (``size``, ``seed``) are said before the runs and kept in their notes,
    as on the local executor.
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from mixprec.bench.configs import parse_configs
    from mixprec.bench.distributed import probe_groups, run_matrix
    from mixprec.measure.cluster import ClusterError, node_groups, select_groups

    with cluster(address) as ray:
        try:
            groups = select_groups(node_groups(ray), hardware_spec)
            say(err_console, f"probing {len(groups)} hardware type(s) on the cluster: "
                + ", ".join(g.describe() for g in groups))
            parts = probe_groups(ray, groups, device)
            # one configuration set for every machine: chosen for the first hardware type
            specs, notes = parse_configs(configs, parts[0].hardware, compiled_twins=compiled)
            unmatched = bench_pre_run_notes(specs, names, size=size, seed=seed)
        except (ClusterError, ValueError) as exc:
            fail(exc)
        said = say_pre_run(unmatched, notes)
        store = open_store(db)
        run_ids: list[int] = []
        deadline = time.monotonic() + budget_s if budget_s is not None else None
        with Progress(TextColumn("{task.description}", markup=False), BarColumn(), TextColumn("{task.completed}"),
                      TimeElapsedColumn(), console=err_console, transient=False) as bar:
            for index, name in enumerate(names):
                tasks = {p.group.label: bar.add_task(f"{name} on {p.group.label}: starting", total=None) for p in parts}

                def step(label: str, description: str, n: int, tasks=tasks, name=name) -> None:
                    bar.update(tasks[label], advance=n, description=f"{name} on {label}: {description}")

                share = None if deadline is None else (deadline - time.monotonic()) / (len(names) - index)
                options = make_options(name, specs, notes + unmatched[name], share)
                # Ray hides the GPUs from a worker that asks for none; a sliver of one lets a
                # run's configurations share the node's GPU, loaded side by side as locally
                gpus = {"num_gpus": 0.001} if device.startswith("cuda") else {}
                run_ids += run_matrix(options, parts, store.path, ray, progress=step, executor_options=gpus)
    runs = [store.load_run(i) for i in run_ids]
    for run in runs if show_run is not None else ():
        show_run(run, said=said.get(run.get("pipeline"), ()))
    print_matrix(runs)
    outputs = Outputs(err_console)
    write_run_exports(outputs, console, runs, html=html, json_out=json_out, csv_out=csv_out)
    say(console, f"stored as run(s) {', '.join(map(str, run_ids))} in {store.path}")
    outputs.finish()
    return run_ids


def compare_matrix(store: Any, run_ids: list[int], as_json: bool, *, only_across_machines: bool = False) -> None:
    """``mixprec compare A B C ... --matrix``: the hardware matrix of the runs (a missing run exits 2).

    With ``only_across_machines`` nothing is printed when the runs share one machine.
    """
    from dataclasses import asdict

    from mixprec.bench.matrix import hardware_matrix, spans_machines
    from mixprec.bench.store import StoreError

    try:
        runs = [store.load_run(i) for i in dict.fromkeys(run_ids)]  # a run named twice is one column
    except StoreError as exc:
        fail(exc)
    if only_across_machines and not spans_machines(runs):
        return
    if as_json:
        import json

        out = [{"pipeline": m.pipeline, "size": m.size, "batch": m.batch, "machines": m.machines, "run_ids": m.run_ids,
                "devices": m.devices, "configs": m.configs, "winners": m.winners, "undecided": m.undecided,
                "cells": [{"config": c, "machine": h, **asdict(cell), "speedup_cell": cell.speed_text}
                          for (c, h), cell in m.cells.items()]}
               for m in hardware_matrix(runs)]
        console.print_json(json.dumps(out, default=str))
        return
    print_matrix(runs)


def tune_on_cluster(ctx: Any, *, executor: str, address: str | None, hardware_spec: str | None, workers: int, worker_cpus: float,
                    pipeline: str, size: str, seeds: list[int], repeat: int, device: str = "cpu") -> dict[str, Any]:
    """The arguments ``mixprec.tune`` gets for ``--executor ray``: a
    :class:`~mixprec.tuning.pool.PoolEvaluator` of ``workers`` actors on one hardware type,
    the hardware probed there on ``device``, and every preset (as the local tuner measures them).
    Empty for ``--executor local``. The cluster and the workers are let go when the command ends.
    """
    if executor == "local":
        return {}
    from mixprec.device.hardware import Hardware
    from mixprec.measure.cluster import ClusterError, node_groups, probe_group, select_groups
    from mixprec.measure.executor import WorkerError, WorkerTimeout
    from mixprec.policy.presets import PRESETS
    from mixprec.tuning.pool import PoolEvaluator

    stack = ExitStack()
    ctx.call_on_close(stack.close)
    ray = stack.enter_context(cluster(address))
    try:
        groups = select_groups(node_groups(ray), hardware_spec)
        if len(groups) > 1:
            raise ClusterError(f"--hardware {quote(hardware_spec)}: a tune run measures on one hardware type, got "
                               f"{', '.join(g.label for g in groups)}; run one tune per type")
        (group,) = groups
        err_console.print(f"tuning on {group.describe()} with {workers} workers of {worker_cpus:g} CPU(s) each",
                          highlight=False, markup=False)
        with ThreadPoolExecutor(max_workers=1) as probing:  # the probe runs while the workers load
            probe = probing.submit(probe_group, ray, group, device)
            # Ray hides the GPUs from a worker that asks for none: a sliver of one lets the workers share it
            gpus = {"num_gpus": 0.001} if device.startswith("cuda") else {}
            try:
                pool = PoolEvaluator(pipeline, group.executor(ray, num_cpus=worker_cpus, **gpus), workers=workers, size=size,
                                     seeds=seeds, repeat=repeat, device=device)
            finally:
                probed = probe.result()
    except (ClusterError, WorkerError, WorkerTimeout, ValueError) as exc:
        stack.close()
        fail(exc)
    stack.callback(pool.close)
    return {"evaluator": pool, "hardware": Hardware.from_dict(probed["hardware"]), "presets": list(PRESETS)}
