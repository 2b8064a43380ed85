"""``mixprec ui`` stopped by a real Ctrl-C while a benchmark runs in the browser: the server stops
with status 0, the run ends as its Cancel would end it (stored as cancelled), no process is left."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("gradio")
gradio_client = pytest.importorskip("gradio_client")

from mixprec.bench.store import Store  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process table from /proc")

MIXPREC = Path(sys.executable).parent / "mixprec"
#: A bound on how long the server, and then the run, may take to reach a point on a busy machine.
WAIT_S = 240


def _session(sid: int) -> list[int]:
    """The live processes of session ``sid`` (zombies left out)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry))
    return found


def _until(condition, what, proc):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the server ended before {what}: {proc.returncode}\n{proc.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not come within {WAIT_S} s")
        time.sleep(0.1)


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
    proc = subprocess.Popen([str(MIXPREC), "ui", "--port", str(port), "--store-dir", str(tmp_path)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _until(lambda: _listening(port), "the server", proc)
        client = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False, download_files=False)
        client.submit("en", "minilm", "test", ["fp32", "fast"], 500, 1, "cpu", str(db), api_name="/run_benchmark")
        _until(lambda: _running(db), "a configuration running", proc)
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=WAIT_S)
        deadline = time.monotonic() + 30
        while _session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _session(proc.pid) == [], output
    finally:
        for pid in _session(proc.pid):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    assert "stopped 1 run(s) in progress: stored as cancelled, with what they measured" in output, output
    with Store(db) as store:
        [run] = store.runs()
        assert run["status"] == "cancelled"
