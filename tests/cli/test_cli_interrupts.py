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
import sys
from pathlib import Path

import pytest

from mixprec.bench.store import Store
from terminal import UNCOUNTED, interrupt, session

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process table from /proc"), UNCOUNTED]

FACTORY = Path(__file__).resolve().parents[1] / "interrupt_factory.py"
MIXPREC = Path(sys.executable).parent / "mixprec"
#: Seconds a moment may take to come on a busy machine (starting Python and importing torch twice).
MOMENT_S = 180


def _maps_hold(pid: int, name: str) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as fh:
            return name in fh.read()
    except OSError:
        return False


def _interrupt(args: list[str], moment: str, tmp_path: Path) -> tuple[str, Path]:
    """Run ``mixprec <args>``, send SIGINT to its process group at ``moment``; returns its output and store."""
    marks, db = tmp_path / "marks", tmp_path / "runs.sqlite"
    marks.mkdir()
    env = {**os.environ, "INTERRUPT_MARKS": str(marks), "INTERRUPT_AT": moment, "COLUMNS": "200"}
    if moment == "import":  # the command itself is importing torch (its library is loaded, its modules not yet)
        what, ready = "torch's import", lambda proc: _maps_hold(proc.pid, "libtorch_python")
    elif moment == "start":  # a worker process exists: it is starting Python and importing torch
        what, ready = "a worker", lambda proc: any("spawn_main" in c for c in session(proc.pid).values())
    else:
        what, ready = f"the moment {moment!r}", lambda proc: any(p.name.startswith(f"{moment}.") for p in marks.iterdir())
    status, output = interrupt([str(MIXPREC), *args, "--pipeline", f"{FACTORY}:build", "--size", "test", "--db", str(db)],
                               what, ready, MOMENT_S, cwd=tmp_path, env=env)
    assert status == 130, output
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
