"""``mixprec bench --executor ray`` stopped by a real Ctrl-C: the command says which run it stored as
cancelled, with status 130 and no traceback, and no worker of its run is left on the cluster."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from ray_cluster import ON_THE_CLUSTER, ray_or_skip, two_types
from terminal import UNCOUNTED, interrupt

ray_or_skip()
pytestmark = [ON_THE_CLUSTER, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process table from /proc"),
              UNCOUNTED]

from mixprec.bench.store import Store  # noqa: E402

MIXPREC = Path(sys.executable).parent / "mixprec"
#: A bound on how long the command may take to reach its first timed runs on a busy machine.
WAIT_S = 300
#: A pipeline that imports nothing beyond torch (tests/small_factory.py, on the cluster workers' path and on the
#: command's, through PYTHONPATH): each run is at least 4000 module calls and one request to the worker, so
#: 100000 of them last minutes on any machine, and the Ctrl-C always comes mid-run.
SLOW = "small_factory:slow"


def _timing(db: Path) -> bool:
    """Whether the run has stored a timed run of its fp32 reference."""
    if not db.exists():
        return False
    try:
        with Store(db) as store:
            return any(c["samples"] for run in store.runs() for c in store.load_run(run["id"])["configs"])
    except Exception:  # being created meanwhile
        return False


def _hosts(ray) -> set[str]:
    """The live actors of mixprec's workers on the cluster."""
    return {a["ActorID"] for a in ray._private.state.actors().values() if a["ActorClassName"] == "_Host" and a["State"] == "ALIVE"}


def test_ctrl_c_on_the_cluster_stores_the_run_as_cancelled_and_stops_its_workers(tmp_path, clean_env):
    ray, cluster = two_types()
    db = tmp_path / "b.sqlite"
    before = _hosts(ray)
    status, output = interrupt([str(MIXPREC), "bench", "--executor", "ray", "--ray-address", cluster.address, "--hardware",
                                "alpha", "--pipeline", SLOW, "--size", "test", "--configs", "fp32", "--repeat", "100000",
                                "--warmup", "0", "--db", str(db)], "a timed run", lambda proc: _timing(db), WAIT_S,
                               cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
    assert status == 130, output
    with Store(db) as store:
        [run] = store.runs()
        configs = store.load_run(run["id"])["configs"]
    assert run["status"] == "cancelled"
    assert f"interrupted: run {run['id']} ({SLOW}) stored as cancelled, with what was measured" in output, output
    assert configs and all(c["status"] == "partial" for c in configs), configs  # cut short: never "ok", nor "failed"
    deadline = time.monotonic() + 60
    while _hosts(ray) - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _hosts(ray) - before == set()
