"""Ctrl-C at any moment of ``mixprec bench`` and ``mixprec tune``: a real process, a real signal.

The command runs in its own session; SIGINT goes to its whole process group, as a terminal's
Ctrl-C does, at a named moment of its worker (``tests/interrupt_factory.py`` waits there):
while the worker starts (importing torch), loads, runs the fp32 reference, runs a
configuration's warm-up or a timed run. Each time: no traceback from any process, one line
saying what was stored, exit status 130, no process of the session left, and the run stored
as ``incomplete`` with what was measured.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mixprec.bench.store import Store

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process table from /proc")

FACTORY = Path(__file__).resolve().parents[1] / "interrupt_factory.py"
MIXPREC = Path(sys.executable).parent / "mixprec"
#: Seconds a moment may take to come on a busy machine (starting Python and importing torch twice).
MOMENT_S = 180


def _session(sid: int) -> dict[int, str]:
    """The live processes of session ``sid``: pid -> command line (zombies, already ended, left out)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if int(fields[3]) != sid or fields[0] == "Z":
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                found[int(entry)] = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
    return found


def _maps_hold(pid: int, name: str) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as fh:
            return name in fh.read()
    except OSError:
        return False


def _wait_for(what, ready, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + MOMENT_S
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the command ended before {what}: exit status {proc.returncode}\n{proc.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not come within {MOMENT_S} s")
        time.sleep(0.02)


def _interrupt(args: list[str], moment: str, tmp_path: Path) -> tuple[str, Path]:
    """Run ``mixprec <args>``, send SIGINT to its process group at ``moment``; returns its output and store."""
    marks, db = tmp_path / "marks", tmp_path / "runs.sqlite"
    marks.mkdir()
    env = {**os.environ, "INTERRUPT_MARKS": str(marks), "INTERRUPT_AT": moment, "COLUMNS": "200"}
    proc = subprocess.Popen([str(MIXPREC), *args, "--pipeline", f"{FACTORY}:build", "--size", "test", "--db", str(db)],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        if moment == "import":  # the command itself is importing torch (its library is loaded, its modules not yet)
            _wait_for("torch's import", lambda: _maps_hold(proc.pid, "libtorch_python"), proc)
        elif moment == "start":  # a worker process exists: it is starting Python and importing torch
            _wait_for("a worker", lambda: any("spawn_main" in c for c in _session(proc.pid).values()), proc)
        else:
            _wait_for(f"the moment {moment!r}", lambda: any(p.name.startswith(f"{moment}.") for p in marks.iterdir()), proc)
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
        # every process the command started ended with it (the resource tracker ends once its pipe closes)
        deadline = time.monotonic() + 30
        while _session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _session(proc.pid) == {}, output
    finally:
        for pid in _session(proc.pid):  # never leave one behind, whatever failed
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    return output, db


def _interrupted_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("interrupted:")]


@pytest.mark.parametrize("moment", ["start", "load", "reference", "16bit-1", "16bit-3"])
def test_ctrl_c_during_a_bench_leaves_no_traceback_no_process_and_an_incomplete_run(moment, tmp_path, clean_env):
    # 16bit-1: the configuration's warm-up; 16bit-3: its second timed run (one of its samples stored)
    output, db = _interrupt(["bench", "--configs", "fp32,naive-bf16", "--warmup", "1", "--repeat", "3"], moment, tmp_path)
    [run] = Store(db).runs()
    assert run["status"] == "incomplete"
    assert _interrupted_lines(output) == [f"interrupted: run {run['id']} ({run['pipeline']}) stored as incomplete, "
                                          "with what was measured"], output
    configs = Store(db).load_run(run["id"])["configs"]
    assert configs and all(c["status"] == "partial" for c in configs), configs  # cut short: never "ok"
    if moment == "16bit-3":
        assert [c["error"] for c in configs] == ["stopped after 2 of 3 timed runs", "stopped after 1 of 3 timed runs"]


def test_ctrl_c_while_the_command_imports_torch_says_one_line(tmp_path, clean_env):
    output, db = _interrupt(["bench", "--configs", "fp32,naive-bf16"], "import", tmp_path)
    assert _interrupted_lines(output) == ["interrupted: stopped by the user (Ctrl-C) while mixprec started"], output
    assert not db.exists()  # nothing began


def test_the_installed_command_starts_outside_the_package():
    """The console script's entry point imports nothing heavy, so a Ctrl-C while torch imports is answered."""
    from importlib.metadata import entry_points

    [script] = entry_points(group="console_scripts", name="mixprec")
    assert script.value == "_mixprec_command:main"


@pytest.mark.parametrize("moment", ["start", "reference"])
def test_ctrl_c_before_the_first_tune_evaluation_keeps_a_run_with_nothing_measured(moment, tmp_path, clean_env):
    output, db = _interrupt(["tune", "--bound", "cosine>=0.99", "--seeds", "1", "--repeat", "1", "--validation-seeds", "0"],
                            moment, tmp_path)
    [listed] = Store(db).tune_runs()
    assert listed["status"] == "incomplete" and listed["evaluations"] == 0
    assert _interrupted_lines(output) == [f"interrupted: tune run {listed['id']} stored as incomplete, with the "
                                          "0 evaluations measured"], output


def test_ctrl_c_during_a_tune_evaluation_stores_what_was_measured_as_incomplete(tmp_path, clean_env):
    output, db = _interrupt(["tune", "--bound", "cosine>=0.99", "--seeds", "1", "--repeat", "1", "--validation-seeds", "0"],
                            "16bit-1", tmp_path)
    [listed] = Store(db).tune_runs()
    stored = Store(db).load_tune_run(listed["id"])
    assert stored["result"]["status"] == listed["status"] == "incomplete"
    assert "interrupted (Ctrl-C) during the search; the result holds what was measured" in stored["result"]["notes"]
    assert _interrupted_lines(output) == [f"interrupted: tune run {listed['id']} stored as incomplete, with the "
                                          f"{listed['evaluations']} evaluation{'s' if listed['evaluations'] != 1 else ''} measured"], output
