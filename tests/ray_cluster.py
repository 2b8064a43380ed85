"""A real Ray cluster on this machine for the cluster tests, and serve functions its workers run.

:func:`two_types` starts (once per test process; the tests marked :data:`ON_THE_CLUSTER` share one) a head node of hardware ``alpha`` and
a second node of hardware ``beta`` on loopback (``ray.cluster_utils.Cluster``), and
connects this process to it. The workers find this module (``PYTHONPATH`` is set to
the tests folder before the nodes start), so the serve functions below run there.
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import Any

import pytest

from mixprec.measure.executor import WORKER_ENV

_STATE: dict[str, Any] = {}

#: The mark of every test that uses the cluster: pytest-xdist (``--dist loadgroup``) runs them
#: all in one worker, so one cluster (two nodes and their workers) serves them all.
ON_THE_CLUSTER = pytest.mark.xdist_group("ray-cluster")


def ray_or_skip() -> Any:
    return pytest.importorskip("ray", reason="Ray is not installed (pip install 'mixprec[ray]')")


def two_types() -> tuple[Any, Any]:
    """``(ray, cluster)``: connected to a cluster with hardware types alpha (head) and beta."""
    ray = ray_or_skip()
    if "cluster" not in _STATE:
        from ray.cluster_utils import Cluster

        tests = str(Path(__file__).resolve().parent)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        # a removed node is declared dead within about 10 s (Ray's default: 30 s); not less,
        # so a node of a loaded machine that answers late is not declared dead by mistake
        system = {"health_check_period_ms": 1000, "health_check_failure_threshold": 10,
                  # no idle Python workers started ahead (each imports Ray, and nothing here would use
                  # one: every mixprec worker is an actor started with its own environment)
                  "enable_worker_prestart": False, "prestart_worker_first_driver": False}
        # Neither the autoscaler's monitor (a fixed cluster) nor a log monitor per node (the driver
        # does not show the workers' logs): each is one more Python process importing Ray.
        quiet = {"include_log_monitor": False}
        # The nodes start without the variables of a measuring worker's environment (as a node
        # started by hand may): a worker has them only if the executor gives them to it.
        kept = {name: os.environ.pop(name) for name in WORKER_ENV if name in os.environ}
        try:
            cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 2, "resources": {"mixprec-hw:alpha": 1}, "include_dashboard": False, "no_monitor": True,
                **quiet, "_system_config": system})
            cluster.add_node(num_cpus=2, resources={"mixprec-hw:beta": 1}, **quiet)
        finally:
            os.environ.update(kept)
        ray.init(address=cluster.address, log_to_driver=False)
        _STATE["cluster"] = cluster

        def stop() -> None:
            ray.shutdown()
            cluster.shutdown()

        atexit.register(stop)
    return ray, _STATE["cluster"]


def serve_state(conn: Any, job: dict[str, Any]) -> None:
    """Report this process, its torch state and its measuring environment; ``dirty`` changes a global torch setting first."""
    import torch

    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    before = torch.get_float32_matmul_precision()
    if job.get("dirty"):
        torch.set_float32_matmul_precision("medium")
    conn.send(("ready", {"pid": os.getpid(), "matmul_at_start": before, "threads": torch.get_num_threads(),
                         "env": {name: os.environ.get(name) for name in WORKER_ENV}}))
    while True:
        command, payload = conn.recv()
        if command == "sleep":
            import time

            time.sleep(float(payload))
            conn.send(("ok", "slept"))
        elif command == "raise":
            raise ValueError(f"asked to fail: {payload}")
        elif command == "finish":
            conn.send(("done", {}))
            return
        else:
            conn.send(("ok", {"echo": payload}))
