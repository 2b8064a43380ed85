"""Workers on a Ray cluster: one fresh Ray actor process per job.

:class:`RayExecutor` implements :class:`~mixprec.measure.executor.Executor`. Each
``start(serve, job)`` creates a new actor (``max_restarts=0``) whose process runs
``serve`` in a thread and answers the caller's requests; ``close()`` kills the actor,
so its process, with whatever torch state it set, ends with the job. Ray schedules
the actors: the executor only says what each one needs (CPUs, GPUs, and the custom
resource naming a node type, see :func:`hardware_resource`).

Ray is optional (``pip install 'mixprec[ray]'``) and imported only when a cluster is
used: :func:`require_ray` raises :class:`RayUnavailable` naming the extra.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any

from mixprec.measure.executor import WORKER_ENV, Serve, WorkerCancelled, WorkerError, WorkerTimeout, _main

__all__ = ["RayExecutor", "RayUnavailable", "RayWorker", "HARDWARE_PREFIX", "hardware_resource", "require_ray", "worker_env"]

#: Custom resources named ``mixprec-hw:LABEL`` mark a node's hardware type.
HARDWARE_PREFIX = "mixprec-hw:"
#: How much of a node's hardware label one worker asks for: a sliver, so the label
#: selects the node without limiting how many workers it holds (CPUs and GPUs do that).
LABEL_SHARE = 0.001
#: How often a worker still loading checks that a node able to run it is alive.
POLL_S = 1.0


class RayUnavailable(RuntimeError):
    """Ray is not installed; the message names the extra that installs it."""


def require_ray() -> Any:
    """The ``ray`` module, or :class:`RayUnavailable` naming the extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailable(f"--executor ray needs Ray, which is not installed ({exc}); "
                             "install it with: pip install 'mixprec[ray]'") from None
    return ray


def hardware_resource(label: str) -> str:
    """The custom resource a node of hardware type ``label`` advertises (``ray start --resources``)."""
    return f"{HARDWARE_PREFIX}{label}"


def worker_env() -> dict[str, str]:
    """The environment an actor's process starts with: :data:`~mixprec.measure.executor.WORKER_ENV`,
    where this process's environment does not set a variable itself (as for a local worker).

    A Ray worker inherits its node's environment, not the caller's; these variables must be there
    when the process starts (OpenMP reads ``OMP_WAIT_POLICY`` once, as torch loads), so they go in
    the actor's ``runtime_env``: Ray starts the actor's process with them set.
    """
    return {name: os.environ.get(name, value) for name, value in WORKER_ENV.items()}


class _QueueConn:
    """The ``conn`` a serve function talks to inside an actor: two in-process queues."""

    def __init__(self, inbox: queue.Queue, outbox: queue.Queue):
        self._inbox, self._outbox = inbox, outbox

    def send(self, message: Any) -> None:
        self._outbox.put(message)

    def recv(self) -> Any:
        return self._inbox.get()


class _Host:  # pragma: no cover - runs in the Ray actor's process
    """The actor: runs ``serve(conn, job)`` in a thread and relays requests to it."""

    def __init__(self, serve: Serve, job: dict[str, Any], threads: int | None):
        import socket

        import ray

        self._inbox: queue.Queue = queue.Queue()
        self._outbox: queue.Queue = queue.Queue()
        job = dict(job)
        if not job.get("threads"):
            # Ray sets OMP_NUM_THREADS=1 in its workers; a local worker uses every core,
            # and so does this one unless the executor asked for fewer.
            job["threads"] = threads or len(os.sched_getaffinity(0))
        context = ray.get_runtime_context()
        self._where = {"node_id": context.get_node_id(), "host": socket.gethostname(),
                       "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}
        threading.Thread(target=_main, args=(_QueueConn(self._inbox, self._outbox), serve, job), daemon=True,
                         name=f"mixprec-{job.get('name', 'worker')}").start()

    def where(self) -> dict[str, Any]:
        return self._where

    def receive(self) -> Any:
        return self._outbox.get()

    def request(self, message: Any) -> Any:
        self._inbox.put(message)
        return self._outbox.get()


def _node_text(where: dict[str, Any] | None, label: str | None) -> str:
    if where is None:
        return f"a node of hardware {label!r}" if label else "its node"
    text = f"node {where['host']} ({where['ip']}, id {where['node_id'][:12]})"
    return f"{text}, hardware {label!r}" if label else text


class RayWorker:
    """The caller's handle on one actor: requests, timeouts, the node it runs on."""

    def __init__(self, executor: RayExecutor, actor: Any, name: str):
        self._executor, self._actor, self.name = executor, actor, name
        self._where_ref = actor.where.remote()
        self._ready_ref = actor.receive.remote()
        self.where: dict[str, Any] | None = None
        self._closed = False

    def _locate(self) -> None:
        if self.where is None:
            ray = self._executor.ray
            done, _ = ray.wait([self._where_ref], timeout=0)
            if done:
                try:
                    self.where = ray.get(self._where_ref)
                except ray.exceptions.RayError:  # the actor died before it could say where: the node stays unnamed
                    self.where = None

    @property
    def node(self) -> str:
        """The node this worker runs on, in words (for messages)."""
        self._locate()
        return _node_text(self.where, self._executor.label)

    def _result(self, ref: Any, timeout: float | None, what: str) -> Any:
        ray = self._executor.ray
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._executor.cancelled.is_set():
                raise WorkerCancelled(f"{self.name}: cancelled; its actor on {self.node} was stopped")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WorkerTimeout(f"no answer within {timeout:.0f} s from {self.node}")
            done, _ = ray.wait([ref], timeout=POLL_S if left is None else min(POLL_S, left))
            if done:
                break
            self._locate()
            if self.where is None:
                # still waiting to be placed: is there a node that could ever take it?
                missing = self._executor.unplaceable()
                if missing:
                    raise WorkerError(f"{self.name} cannot start: {missing}")
        try:
            kind, payload = ray.get(ref)
        except ray.exceptions.RayError as exc:
            if self._executor.cancelled.is_set():  # its actor was stopped for the cancel, not lost
                raise WorkerCancelled(f"{self.name}: cancelled; its actor on {self.node} was stopped") from None
            self._locate()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise WorkerError(f"{self.name}: {what} lost with {self.node}: {type(exc).__name__}: {first}") from None
        if kind == "error":
            raise WorkerError(f"{payload}\n(on {self.node})")
        return payload

    def wait_ready(self, timeout: float | None) -> Any:
        return self._result(self._ready_ref, timeout, "the worker")

    def request(self, command: str, payload: Any = None, *, timeout: float | None = None) -> Any:
        if self._closed:
            raise WorkerError(f"{self.name}: the worker was closed")
        return self._result(self._actor.request.remote((command, payload)), timeout, f"request {command!r}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor._forget(self)
        try:
            self._executor.ray.kill(self._actor, no_restart=True)
        except Exception:  # the actor or its node is gone already: nothing left to stop
            pass


class RayExecutor:
    """Start each worker as a fresh Ray actor process.

    Args:
        ray: the initialised ``ray`` module (see :func:`mixprec.measure.cluster.connect`).
        label: the hardware type the workers must run on (``None``: any node).
        node_id: pin the workers to this node instead (a node without a label).
        num_cpus: CPUs each worker holds while it lives (``None``: none, so a node's
            workers can all be loaded at once, as the benchmark loads every
            configuration before timing them one at a time).
        num_gpus: GPUs each worker holds.
        threads: torch threads in each worker (``None``: ``num_cpus`` when given, else
            every core the worker's process may use, like a local worker).
        resources: more custom resources each worker needs.
    """

    def __init__(self, ray: Any, *, label: str | None = None, node_id: str | None = None, num_cpus: float | None = None,
                 num_gpus: float = 0, threads: int | None = None, resources: dict[str, float] | None = None):
        self.ray, self.label, self.node_id = ray, label, node_id
        self.num_cpus, self.num_gpus, self.threads = num_cpus, num_gpus, threads
        self.resources = dict(resources or {})
        self.cancelled = threading.Event()
        self._live: set[RayWorker] = set()
        self._lock = threading.Lock()
        self._host = ray.remote(_Host)

    def _options(self) -> dict[str, Any]:
        resources = dict(self.resources)
        if self.label is not None:
            resources[hardware_resource(self.label)] = LABEL_SHARE
        # An actor that names no CPUs holds one while it lives: a node would then hold no
        # more workers than CPUs, and the benchmark, which loads every configuration before
        # timing them one at a time, would wait forever for the rest.
        options: dict[str, Any] = {"max_restarts": 0, "max_task_retries": 0, "num_gpus": self.num_gpus,
                                   "num_cpus": self.num_cpus or 0, "runtime_env": {"env_vars": worker_env()}}
        if resources:
            options["resources"] = resources
        if self.node_id is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self.node_id, soft=False)
        return options

    def start(self, serve: Serve, job: dict[str, Any]) -> RayWorker:
        if self.cancelled.is_set():
            raise WorkerCancelled(f"{job.get('name', 'worker')}: not started, the run was cancelled")
        threads = self.threads or (int(self.num_cpus) if self.num_cpus and self.num_cpus >= 1 else None)
        host = self._host.options(**self._options())
        actor = host.remote(serve, job, threads)
        worker = RayWorker(self, actor, str(job.get("name", "worker")))
        with self._lock:
            self._live.add(worker)
        return worker

    def _forget(self, worker: RayWorker) -> None:
        with self._lock:
            self._live.discard(worker)

    def unplaceable(self) -> str | None:
        """Why no alive node can take this executor's workers, or ``None`` when one can."""
        alive = [n for n in self.ray.nodes() if n.get("Alive")]
        if self.node_id is not None:
            if not any(n.get("NodeID") == self.node_id for n in alive):
                return f"node id {self.node_id[:12]} is no longer alive"
            return None
        if self.label is not None:
            key = hardware_resource(self.label)
            if not any(n.get("Resources", {}).get(key) for n in alive):
                return f"no alive node has hardware {self.label!r} (resource {key}); the node was lost"
        return None

    def cancel(self) -> None:
        """Stop every live worker now (Ctrl-C): their pending requests fail as cancelled."""
        self.cancelled.set()
        with self._lock:
            live = list(self._live)
        for worker in live:
            worker.close()
