"""The benchmark on a Ray cluster: the same configurations on every hardware type, one run each.

:func:`run_matrix` runs :func:`mixprec.bench.runner.run_bench` once per
:class:`~mixprec.measure.cluster.NodeGroup`, all at the same time, each with a
:class:`~mixprec.measure.ray_executor.RayExecutor` that puts every worker of the run on
the node of that group its probe ran on. Each run stores the hardware probe,
fingerprint and versions measured on that node, so its speed-ups are against its own
fp32 and never mix two machines. The workers send their results back to this process,
the only one that writes the store (one SQLite connection per run, in this process).

A node lost mid-run fails the configurations it held, with the node named in their
error; the other runs go on. Ctrl-C stops every worker on the cluster, stores what was
measured (``cancelled``) and then raises :class:`~mixprec.bench.runner.BenchInterrupted`
(a ``KeyboardInterrupt``) naming them.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from mixprec.bench.matrix import MATRIX_NOTE
from mixprec.bench.runner import BenchInterrupted, BenchOptions, run_bench
from mixprec.bench.store import Store
from mixprec.device.hardware import Hardware
from mixprec.measure.cluster import NodeGroup, probe_group
from mixprec.measure.ray_executor import RayExecutor

__all__ = ["GroupRun", "probe_groups", "run_matrix"]


@dataclass
class GroupRun:
    """One hardware type's part of a matrix: its group, what was probed there, and its run."""

    group: NodeGroup
    probe: dict[str, Any]
    run_id: int | None = None
    error: BaseException | None = None

    @property
    def hardware(self) -> Hardware:
        return Hardware.from_dict(self.probe["hardware"])


def probe_groups(ray: Any, groups: Sequence[NodeGroup], device: str) -> list[GroupRun]:
    """Probe every group's hardware on one of its nodes, all at once.

    Raises:
        ClusterError: a probe failed (nothing was stored).
    """
    with ThreadPoolExecutor(max_workers=max(1, len(groups))) as pool:
        probes = list(pool.map(lambda g: probe_group(ray, g, device), groups))
    return [GroupRun(group, probe) for group, probe in zip(groups, probes)]


def run_matrix(
    options: BenchOptions,
    parts: Sequence[GroupRun],
    store_path: Any,
    ray: Any,
    *,
    executor_options: dict[str, Any] | None = None,
    progress: Callable[[str, str, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[int]:
    """Benchmark ``options`` on every group of ``parts`` at once; returns the run ids (in order).

    Args:
        options: what to measure (the same for every group).
        parts: the groups and their probes (:func:`probe_groups`).
        store_path: the SQLite store; each run writes through its own connection.
        ray: the connected ``ray`` module.
        executor_options: passed to each :class:`RayExecutor` (``num_cpus``, ``num_gpus``, ``threads``).
        progress: ``(group label, description, steps)`` after each worker step.
        should_stop: checked after each step of every run; true cancels all of them.

    Raises:
        BenchInterrupted: Ctrl-C, after every worker was stopped and each run stored as cancelled
            (a ``KeyboardInterrupt``; its message names the runs).
        BaseException: the first error of a run's own code (its run is stored as failed).
    """
    stop = threading.Event()
    # one tag in every run's notes ties the runs of this matrix together (see matrix.matrix_runs)
    tag = f"{MATRIX_NOTE} {uuid.uuid4().hex[:12]} over {', '.join(p.group.label for p in parts)}"
    # every worker of a run on the node that was probed: its ratios never mix two machines,
    # even where a hardware type has several nodes
    executors = [RayExecutor(ray, label=part.group.label if part.group.labelled else None,
                             node_id=part.probe["node"]["node_id"], **(executor_options or {})) for part in parts]

    def stopped() -> bool:
        return stop.is_set() or (should_stop is not None and should_stop())

    def bench_one(part: GroupRun, executor: RayExecutor) -> None:
        label = part.group.label
        note = (f"measured on Ray hardware {label!r}: node {part.probe['node'].get('host')} "
                f"({part.probe['node'].get('ip')}); speed-ups are against this run's own fp32")
        mine = replace(options, notes=[*options.notes, note, tag], on_plan=None)

        def step(description: str, n: int) -> None:
            if progress is not None:
                progress(label, description, n)

        try:
            with Store(store_path) as store:
                part.run_id = run_bench(mine, part.hardware, store, executor=executor, progress=step,
                                        should_stop=stopped, node={"node": part.probe["node"], "versions": part.probe["versions"]})
                if stop.is_set():
                    # its workers were stopped under it: what it stored is what it had measured
                    store.finish_run(part.run_id, status="cancelled")
        except BaseException as exc:  # kept for the caller: this thread must not die silently
            part.error = exc
        finally:
            done[label].set()

    # waiting on events, not Thread.join: a join that Ctrl-C interrupts can leave a live
    # thread marked as finished (CPython), and its run would then be read half written
    done = {part.group.label: threading.Event() for part in parts}
    threads = [threading.Thread(target=bench_one, args=(part, executor), name=f"mixprec-bench-{part.group.label}", daemon=True)
               for part, executor in zip(parts, executors)]
    for thread in threads:
        thread.start()
    try:
        for event in done.values():
            while not event.wait(0.5):
                pass
    except KeyboardInterrupt:
        stop.set()
        for executor in executors:
            executor.cancel()
        for event in done.values():
            event.wait()
        raise BenchInterrupted([part.run_id for part in parts if part.run_id is not None], options.pipeline,
                               "cancelled") from None
    errors = [part.error for part in parts if part.error is not None]
    if errors:
        raise errors[0]
    return [part.run_id for part in parts if part.run_id is not None]
