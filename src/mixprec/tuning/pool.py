"""Measuring many policies at once: :class:`PoolEvaluator`, several long-lived tune workers
started through any :class:`~mixprec.measure.executor.Executor` (local processes, or Ray
actors on a cluster).

The search stays sequential; what runs in parallel are the evaluations it will ask for
next (a round: the baseline, the 16-bit starts and the presets; the moves of a local
search pass; the next probes of a group test), started ahead on idle workers through
:meth:`PoolEvaluator.submit` (see :meth:`mixprec.tuning.search.Search.prefetch`).

Each evaluation times its candidate against fp32 timed just before it in the same
worker (``paired``), so a candidate measured on another node, or on a node another
worker is loading, is compared with fp32 under the same conditions. Its latency is
that ratio times the fp32 time the first worker measured at the start: seconds at one
machine's scale, comparable across workers.
"""

from __future__ import annotations

import queue
import statistics
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Sequence

from mixprec.policy import Policy
from mixprec.tuning.candidates import Config, Evaluation
from mixprec.tuning.evaluators import ReadyWorkers, _evaluation
from mixprec.tuning.session import serve_tune

__all__ = ["PoolEvaluator"]


class PoolEvaluator(ReadyWorkers):
    """Evaluate policies of a registered pipeline on ``workers`` workers at once.

    Args:
        pipeline_name: registered pipeline or factory spec (as for
            :class:`~mixprec.tuning.evaluators.WorkerEvaluator`).
        executor: starts the workers (e.g. a :class:`~mixprec.measure.ray_executor.RayExecutor`).
        workers: how many evaluations run at the same time.
        size, seeds, repeat, batch, timeout, threads, device: as for ``WorkerEvaluator``.
    """

    def __init__(self, pipeline_name: str, executor: Any, *, workers: int = 2, size: str = "default",
                 seeds: Sequence[int] = (0, 1), repeat: int = 3, batch: int = 1, timeout: float = 600.0,
                 threads: int | None = None, device: str | None = None):
        from mixprec.pipelines import portable_spec

        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        pipeline_name = portable_spec(pipeline_name)
        self.pipeline, self.size, self.seeds, self.repeat, self.timeout = pipeline_name, size, tuple(seeds), int(repeat), timeout
        self.cache_key = f"{pipeline_name}|size={size}|batch={batch}|seeds={list(self.seeds)}|repeat={self.repeat}|paired"
        self.device = device
        job = {"name": f"tune-{pipeline_name}", "pipeline": pipeline_name, "size": size, "batch": batch, "threads": threads,
               "device": device}
        self._workers: list[Any] = []
        self._locks = [threading.Lock() for _ in range(workers)]
        self._idle: queue.Queue[int] = queue.Queue()
        self._busy = 0
        self._count = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mixprec-tune")
        try:
            self._workers = [executor.start(serve_tune, dict(job, name=f"tune-{i}-{pipeline_name}")) for i in range(workers)]
            readies = list(self._pool.map(self._setup, self._workers))
            self.ready = readies[0]
            # the scale every worker's ratios are put on: fp32 as the first worker measured it
            samples = self._request(0, "tune_time", {"policy": Config("fp32").policy("fp32").to_dict(), "repeat": max(3, self.repeat)})
            self.reference_s = statistics.median(samples)
        except BaseException:
            self.close()
            raise
        for index in range(workers):
            self._idle.put(index)
        self.where = [getattr(w, "node", "this machine") for w in self._workers]

    def _setup(self, worker: Any) -> dict[str, Any]:
        ready = worker.wait_ready(self.timeout)
        worker.request("tune_reference", {"seeds": list(self.seeds)}, timeout=self.timeout)
        return ready

    def _request(self, index: int, command: str, payload: Any) -> Any:
        with self._locks[index]:
            return self._workers[index].request(command, payload, timeout=self.timeout)

    def _measure(self, policy: Policy) -> Evaluation:
        index = self._idle.get()
        try:
            raw = self._request(index, "tune_eval", {"policy": policy.to_dict(), "repeat": self.repeat, "paired": True})
        finally:
            self._idle.put(index)
            with self._count:
                self._busy -= 1
        raw = dict(raw, latency_s=raw["latency_s"] / raw["fp32_latency_s"] * self.reference_s)
        return _evaluation(raw)

    @property
    def workers(self) -> int:
        return len(self._workers)

    def idle(self) -> int:
        """Workers with nothing to do (no evaluation running or queued for them)."""
        with self._count:
            return self.workers - self._busy

    def submit(self, policy: Policy) -> Future:
        """Start measuring ``policy`` on the next free worker; the future holds its :class:`Evaluation`."""
        with self._count:
            self._busy += 1
        return self._pool.submit(self._measure, policy)

    def evaluate(self, policy: Policy) -> Evaluation:
        return self.submit(policy).result()

    def time(self, policy: Policy, repeat: int = 1) -> list[float]:
        """Seconds of ``repeat`` runs under ``policy``, always on the first worker (side-by-side re-timing)."""
        return list(self._request(0, "tune_time", {"policy": policy.to_dict(), "repeat": repeat}))

    def risk(self, policy: Policy) -> list[dict[str, Any]]:
        return self._request(0, "tune_profile", {"policy": policy.to_dict()})

    def _ask(self, command: str, payload: Any) -> Any:
        return self._request(0, command, payload)

    def close(self) -> None:
        """Drop queued evaluations and stop every worker."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for worker in self._workers:
            worker.close()

    def __enter__(self) -> PoolEvaluator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
