"""Every state a stored run can be in, classified in one place and said by every reader: the gate, the
exports and the HTML report, on runs written into a real store."""

from __future__ import annotations

import csv
import io
import json

import pytest

from mixprec.bench import export, report, runstate
from mixprec.bench.gate import Thresholds, check
from mixprec.bench.store import Store
from run_states import RUNS, store_of_states

NOT_FINAL = sorted(set(RUNS) - {"complete", "older record"})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    path = tmp_path_factory.mktemp("states") / "s.sqlite"
    ids = store_of_states(path)
    with Store(path) as store:
        return {state: store.load_run(run_id) for state, run_id in ids.items()}


def test_every_state_has_a_stored_run():
    assert set(RUNS) == set(runstate.STATES)


@pytest.mark.parametrize("state", sorted(RUNS))
def test_each_stored_run_is_classified_by_its_worst_state(state, runs):
    found = runstate.classify(runs[state])
    assert found.state == state
    assert found.final is (state not in NOT_FINAL)
    assert found.usable is (state not in runstate.UNUSABLE)
    assert (found.warning is None) is found.final
    assert "Traceback" not in found.text and len(found.text) < 2000
    assert found.to_dict()["problems"][0]["state"] == state if state != "complete" else found.to_dict()["problems"] == []


def test_what_a_state_says():
    nothing = runstate.classify({"id": 7, "status": "complete", "machine": {"device": "cpu"}, "configs": []})
    assert nothing.text == "nothing measured: it has no configuration" and not nothing.usable
    said = {s: runstate.classify(r).text for s, r in (("x", {"status": "incomplete", "configs": []}),)}
    assert said["x"].startswith("interrupted: it never finished") and "nothing measured" in said["x"]


def test_a_stored_error_shows_its_exception_line_only(runs):
    text = runstate.classify(runs["nothing measured"]).text
    assert "fp32@1 (failed: RuntimeError: boom), fast@1 (timeout)" in text


@pytest.mark.parametrize("state", sorted(RUNS))
def test_the_gate_never_passes_against_a_baseline_that_holds_the_run_to_nothing(state, runs):
    result = check(runs["complete again"], runs[state], Thresholds())
    if state in runstate.UNUSABLE:
        assert not result.passed and result.violations == []
        (reason,) = result.unusable
        assert reason.startswith(f"baseline {runs[state]['id']} has nothing to compare against ({state}: ")
    else:  # a run some of whose configurations did not run, or one stored without its device, still holds the others
        assert result.passed, result
        assert state == "complete" or result.notes


@pytest.mark.parametrize("state", sorted(RUNS))
def test_the_gate_never_passes_a_run_that_is_not_a_result(state, runs):
    result = check(runs[state], runs["complete"], Thresholds())
    assert result.passed is (state in ("complete", "older record")), result
    if state in runstate.UNFINISHED:
        assert any(u.startswith(f"run {runs[state]['id']} cannot be gated: {state}: ") for u in result.unusable)
    elif state not in ("complete", "older record"):
        assert result.unusable == [] and result.violations


@pytest.mark.parametrize("state", sorted(RUNS))
def test_the_exports_say_each_runs_state(state, runs):
    records = json.loads(export.to_json([runs[state]]))
    rows = list(csv.DictReader(io.StringIO(export.to_csv([runs[state]]))))
    assert len(records) == len(rows) == len(runs[state]["configs"])
    for record, row in zip(records, rows):
        assert record["run_state"] == row["run_state"] == state
        assert record["run_final"] is (state not in NOT_FINAL) and row["run_final"] == str(state not in NOT_FINAL)
        assert record["run_state_reason"] == row["run_state_reason"] == runstate.classify(runs[state]).text


def test_a_run_without_configurations_is_still_one_exported_record():
    run = {"id": 3, "status": "incomplete", "pipeline": "tts", "machine": {"device": "cpu"}, "configs": []}
    (record,) = json.loads(export.to_json([run]))
    assert record["config"] is None and record["run_state"] == "interrupted" and record["run_final"] is False
    assert "nothing measured: it has no configuration" in record["run_state_reason"]


@pytest.mark.parametrize("state", sorted(RUNS))
def test_the_report_says_each_runs_state(state, runs):
    page = report.render_html([runs[state]])
    if state in NOT_FINAL:
        assert f"Not a final result ({state})." in page
    else:
        assert "Not a final result" not in page
    assert ("older record" in page) is (state == "older record")


@pytest.mark.parametrize("state", sorted(RUNS))
def test_the_hardware_matrix_names_no_winner_from_a_run_that_holds_nothing(state, runs):
    from mixprec.bench.matrix import hardware_matrix

    other = dict(runs["complete"], machine_fingerprint="g")  # another machine, so each run is a column
    (matrix,) = hardware_matrix([runs[state], other])
    column = matrix.machines[0]
    if state in runstate.UNUSABLE:
        assert matrix.winners[column] is None
        assert matrix.undecided[column] == f"no winner: run {runs[state]['id']} is not a final result ({state})"
    else:
        assert "not a final result" not in (matrix.undecided[column] or "")
