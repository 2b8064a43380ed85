"""``mixprec ui`` stopped by a real Ctrl-C while a benchmark runs in the browser: the server stops
with status 0, the run ends as its Cancel would end it (stored as cancelled), no process is left."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

pytest.importorskip("gradio")
gradio_client = pytest.importorskip("gradio_client")

from mixprec.bench.store import Store  # noqa: E402
from terminal import UNCOUNTED, interrupt  # noqa: E402

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process table from /proc"), UNCOUNTED]

MIXPREC = Path(sys.executable).parent / "mixprec"
#: A bound on how long the server, and then the run, may take to reach a point on a busy machine.
WAIT_S = 240


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _running(db: Path) -> bool:
    if not db.exists():
        return False
    try:
        with Store(db) as store:
            return any(c["status"] == "running" for run in store.runs() for c in store.load_run(run["id"])["configs"])
    except Exception:  # the store is being created meanwhile
        return False


def test_ctrl_c_stops_the_server_and_its_benchmark_stored_as_cancelled(tmp_path, clean_env):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    db = tmp_path / "ui.sqlite"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    submitted = []

    def running(proc) -> bool:
        """The server answers, the benchmark was submitted, and a configuration of it runs."""
        if not submitted:
            if not _listening(port):
                return False
            client = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False, download_files=False)
            submitted.append(client.submit("en", "minilm", "test", ["fp32"], 500, 1, "cpu", str(db), api_name="/run_benchmark"))
        return _running(db)

    status, output = interrupt([str(MIXPREC), "ui", "--port", str(port), "--store-dir", str(tmp_path)],
                               "a benchmark running in the UI", running, WAIT_S, cwd=tmp_path, env=env)
    assert status == 0, output
    assert "stopped 1 run(s) in progress: stored as cancelled, with what they measured" in output, output
    with Store(db) as store:
        [run] = store.runs()
        assert run["status"] == "cancelled"
