"""Every command that reads runs (``gate``, ``compare``, ``runs list``, ``runs show`` with ``--json``,
``--csv`` and ``--html``) says the state of each stored run, never passes or shows as a final result
a run that is not one, and never prints a traceback: on a real store holding a run in every state."""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from mixprec.bench import runstate
from mixprec.bench.store import Store
from mixprec.cli import app
from run_states import RUNS, store_of_states

runner = CliRunner()

NOT_FINAL = sorted(set(RUNS) - {"complete", "older record"})
#: The gate's exit status for each state of the run it checks (against a complete baseline): 2 where it cannot
#: decide (the run did not finish), 1 where the run fails (it measured nothing, its fp32 or its timings are missing,
#: configurations did not run), 0 where it passes.
AS_RUN = {"complete": 0, "older record": 0, "partly measured": 1, "no timed rounds": 1, "reference failed": 1,
          "nothing measured": 1, "interrupted": 2, "cancelled": 2, "runner failed": 2, "unknown status": 2}


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    path = tmp_path_factory.mktemp("states") / "s.sqlite"
    return str(path), store_of_states(path)


def _invoke(args, *, data=False):
    """``data``: the output is the store's data (an export keeps each error's traceback as stored)."""
    result = runner.invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert data or "Traceback" not in result.output
    return result


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("state", sorted(RUNS))
def test_gate_against_each_state_of_baseline(state, stored, clean_env):
    db, ids = stored
    result = _invoke(["gate", str(ids["complete again"]), "--baseline", str(ids[state]), "--db", db])
    if state in runstate.UNUSABLE:
        assert result.exit_code == 2 and result.stdout == ""
        assert result.stderr.startswith(f"error: gate cannot decide: run {ids['complete again']} vs baseline {ids[state]}")
        assert f"baseline {ids[state]} has nothing to compare against ({state}: " in _flat(result.stderr)
    else:
        assert result.exit_code == 0 and "gate passed" in result.stdout
        assert state == "complete" or f"baseline {ids[state]} is {state}: " in _flat(result.stdout)


@pytest.mark.parametrize("state", sorted(RUNS))
def test_gate_of_each_state_of_run(state, stored, clean_env):
    db, ids = stored
    result = _invoke(["gate", str(ids[state]), "--baseline", str(ids["complete"]), "--db", db])
    assert result.exit_code == AS_RUN[state], result.output
    if AS_RUN[state] == 2:
        assert f"run {ids[state]} cannot be gated: {state}: " in _flat(result.stderr)
    elif AS_RUN[state] == 1:
        assert result.stdout.startswith(f"gate FAILED: run {ids[state]} vs baseline {ids['complete']}")


def test_the_baseline_that_measured_nothing_in_ci(stored, clean_env):
    """A baseline in which every configuration failed: exit 2, what failed (its exception line), what to do."""
    db, ids = stored
    result = _invoke(["gate", str(ids["complete"]), "--baseline", str(ids["nothing measured"]), "--db", db])
    said = _flat(result.stderr)
    assert result.exit_code == 2
    assert ("nothing measured: every configuration failed (fp32@1 (failed: RuntimeError: boom), fast@1 (timeout))"
            in said) and "choose a --baseline run that finished" in said and 'File "worker.py"' not in said


@pytest.mark.parametrize("state", sorted(RUNS))
@pytest.mark.parametrize("as_json", [False, True])
def test_compare_says_each_runs_state(state, as_json, stored, clean_env):
    db, ids = stored
    result = _invoke(["compare", str(ids["complete"]), str(ids[state]), "--db", db, *(["--json"] if as_json else [])])
    assert result.exit_code == 0, result.output
    if as_json:
        rows = json.loads(result.stdout)
        assert rows and all(r["state_a"] == "complete" and r["final_a"] is True for r in rows)
        assert all(r["state_b"] == state and r["final_b"] is (state not in NOT_FINAL) for r in rows)
    else:
        warned = f"not a final result: run {ids[state]}: {state}: " in _flat(result.stdout)
        assert warned is (state in NOT_FINAL)


def test_runs_list_says_each_runs_state(stored, clean_env):
    db, ids = stored
    listed = _invoke(["runs", "list", "--db", db, "--json"])
    by_id = {row["id"]: row for row in json.loads(listed.stdout)}
    for state, run_id in ids.items():
        expected = "complete" if state == "complete again" else state
        assert by_id[run_id]["state"] == expected and by_id[run_id]["final"] is (expected not in NOT_FINAL)
    text = _flat(_invoke(["runs", "list", "--db", db]).stdout)
    for state in NOT_FINAL:
        assert f"run {ids[state]}: {state}: " in text
    assert f"run {ids['complete']}: " not in text


@pytest.mark.parametrize("state", sorted(RUNS))
def test_runs_show_and_its_files_say_the_state(state, stored, tmp_path, clean_env):
    db, ids = stored
    run_id = ids[state]
    html, table = tmp_path / "r.html", tmp_path / "r.csv"
    shown = _invoke(["runs", "show", str(run_id), "--db", db, "--html", str(html), "--csv", str(table)])
    assert shown.exit_code == 0
    assert f"run {run_id}: tts ({state}) on test cpu" in _flat(shown.stdout)
    assert (f"not a final result: {state}: " in _flat(shown.stdout)) is (state in NOT_FINAL)
    assert (f"Not a final result ({state})." in html.read_text()) is (state in NOT_FINAL)
    assert {row["run_state"] for row in csv.DictReader(table.open())} == {state}
    records = json.loads(_invoke(["runs", "show", str(run_id), "--db", db, "--json"], data=True).stdout)
    assert {r["run_state"] for r in records} == {state} and {r["run_final"] for r in records} == {state not in NOT_FINAL}


@pytest.mark.parametrize("args", [["gate", "999", "--baseline", "1"], ["gate", "1", "--baseline", "999"],
                                  ["compare", "1", "999"], ["runs", "show", "999"]])
def test_a_run_id_that_does_not_exist(args, stored, clean_env):
    db, _ = stored
    result = _invoke([*args, "--db", db])
    assert result.exit_code == 2 and "no run 999 in" in result.stderr and "recent runs: 11, 10, 9" in _flat(result.stderr)


def test_an_empty_store(tmp_path, clean_env):
    db = str(tmp_path / "empty.sqlite")
    Store(db).close()
    assert _invoke(["runs", "list", "--db", db]).stdout.startswith(f"no runs in {db}")
    assert json.loads(_invoke(["runs", "list", "--db", db, "--json"]).stdout) == []
    for args in (["gate", "2", "--baseline", "1"], ["compare", "1", "2"], ["runs", "show", "1"]):
        result = _invoke([*args, "--db", db])
        assert result.exit_code == 2 and "recent runs: none" in result.stderr


def test_a_run_written_by_an_older_schema(tmp_path, clean_env):
    """A run stored under schema version 1 (no size, no device): read through the migration, said to be an
    older record, and still gated against a run of its pipeline."""
    db = tmp_path / "old.sqlite"
    with Store(db, target_version=1) as old:
        old._conn.execute("BEGIN")
        old._conn.execute("INSERT INTO runs(started, status, pipeline, machine_json, machine_fingerprint, versions_json) "
                          "VALUES ('2026-01-01 00:00:00', 'complete', 'tts', '{\"name\": \"test cpu\"}', 'f', '{}')")
        old._conn.execute("COMMIT")
    listed = json.loads(_invoke(["runs", "list", "--db", str(db), "--json"]).stdout)
    assert [(r["state"], r["final"]) for r in listed] == [("nothing measured", False)]
    assert "older record: stored by an older mixprec, without the device" in listed[0]["state_text"]
    result = _invoke(["gate", "1", "--baseline", "1", "--db", str(db)])
    assert result.exit_code == 2 and "baseline 1 has nothing to compare against (nothing measured" in _flat(result.stderr)
