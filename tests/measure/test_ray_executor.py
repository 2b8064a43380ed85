"""The Ray executor on a real local cluster: a fresh process per job, on the asked hardware,
errors that name the node; and what happens without Ray or without a cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ray_cluster import ON_THE_CLUSTER, ray_or_skip, serve_state, two_types

ray_or_skip()
pytestmark = ON_THE_CLUSTER

from mixprec.measure.cluster import ClusterError, node_groups, select_groups  # noqa: E402
from mixprec.measure.executor import WORKER_ENV, WorkerError, WorkerTimeout  # noqa: E402
from mixprec.measure.ray_executor import POLL_S, RayExecutor  # noqa: E402


def test_each_job_runs_in_a_fresh_process_on_its_hardware():
    ray, _ = two_types()
    beta = RayExecutor(ray, label="beta", num_cpus=1)
    first = beta.start(serve_state, {"name": "first", "dirty": True})
    ready = first.wait_ready(120)
    assert ready["matmul_at_start"] == "highest" and ready["threads"] == 1  # num_cpus=1: one torch thread
    # the measuring worker's environment (OpenMP threads that wait passively), which the node's own
    # environment lacks (see ray_cluster): as a local worker has it, unless this process sets it otherwise
    assert ready["env"] == {name: os.environ.get(name, value) for name, value in WORKER_ENV.items()}
    assert first.request("echo", [1, 2], timeout=30) == {"echo": [1, 2]}
    assert "hardware 'beta'" in first.node and first.where["node_id"] in node_groups(ray)[1].node_ids
    first.close()
    # the next job gets a new process: the global torch setting the first one changed is gone
    second = beta.start(serve_state, {"name": "second"})
    again = second.wait_ready(120)
    assert again["pid"] != ready["pid"] and again["matmul_at_start"] == "highest"
    # a slow answer times out (the worker sleeps 3 s, the caller waits 1 s: no load makes it answer in time);
    # a worker's own error comes back with where it happened (the actor answers it once its sleep is over)
    with pytest.raises(WorkerTimeout, match="no answer within 1 s from node .*hardware 'beta'"):
        second.request("sleep", 3, timeout=1)
    with pytest.raises(WorkerError, match="ValueError: asked to fail: now(.|\n)*on node .*hardware 'beta'"):
        second.request("raise", "now", timeout=120)
    second.close()
    with pytest.raises(WorkerError, match="closed"):
        second.request("echo", 1, timeout=5)


class _CountingRay:
    """The real ``ray`` module, counting the waits that block (``ray.wait`` with a timeout above 0)."""

    def __init__(self, ray):
        self._ray, self.polls = ray, 0

    def wait(self, refs, *, timeout=None, **kwargs):
        if timeout is None or timeout > 0:
            self.polls += 1
        return self._ray.wait(refs, timeout=timeout, **kwargs)

    def __getattr__(self, name):
        return getattr(self._ray, name)


def test_a_label_no_node_has_fails_instead_of_waiting():
    ray, _ = two_types()
    counting = _CountingRay(ray)
    worker = RayExecutor(counting, label="gamma").start(serve_state, {"name": "nowhere"})
    with pytest.raises(WorkerError, match="no alive node has hardware 'gamma' \\(resource mixprec-hw:gamma\\)"):
        worker.wait_ready(60)
    # refused at the first poll that finds the worker unplaced, not after the polls of its 60 s limit
    assert counting.polls == 1 < 60 / POLL_S
    worker.close()


def test_hardware_selection_names_what_was_asked_and_what_is_there():
    ray, _ = two_types()
    groups = node_groups(ray)
    assert [g.label for g in groups] == ["alpha", "beta"] and all(g.cpus == 2 for g in groups)
    assert [g.label for g in select_groups(groups, "all")] == ["alpha", "beta"]
    assert [g.label for g in select_groups(groups, "beta, alpha")] == ["beta", "alpha"]
    with pytest.raises(ClusterError, match="--hardware 'alpha,h100': no alive node has hardware 'h100'.*the cluster has: alpha .*; beta"):
        select_groups(groups, "alpha,h100")
    with pytest.raises(ClusterError, match="the cluster has 2 hardware types: alpha .*choose with --hardware"):
        select_groups(groups, None)


def _cli(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_without_ray_the_error_names_the_extra(tmp_path):
    db = tmp_path / "b.sqlite"
    result = _cli(f"""
        import sys
        sys.modules["ray"] = None  # as if Ray were not installed
        from mixprec.cli import main
        main(["bench", "--executor", "ray", "--pipeline", "minilm", "--size", "test", "--db", {str(db)!r}])
    """)
    assert result.returncode == 2, result.stderr
    assert "pip install 'mixprec[ray]'" in result.stderr
    assert not db.exists()  # nothing was started or stored


def test_an_unreachable_address_exits_2_before_any_work(tmp_path):
    db = tmp_path / "b.sqlite"
    result = _cli(f"""
        from mixprec.cli import main
        main(["bench", "--executor", "ray", "--ray-address", "127.0.0.1:9", "--pipeline", "minilm", "--size", "test",
              "--db", {str(db)!r}])
    """)
    assert result.returncode == 2, result.stderr
    assert "--ray-address '127.0.0.1:9': cannot reach a Ray cluster there" in " ".join(result.stderr.split())
    assert not db.exists()
