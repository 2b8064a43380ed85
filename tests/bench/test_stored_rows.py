"""A configuration is judged by its stored rows, not by its status alone: one marked ``ok`` whose rows hold
no measurement (no figure, fewer timed runs than asked, timed runs without figures, a latency without its
timed runs) counts as not measured by every reader: the run's state, the table, the exports and the gate."""

from __future__ import annotations

import csv
import io

import pytest

import json

from mixprec.bench import export, report, runstate
from mixprec.bench.gate import Thresholds, check, compare
from mixprec.bench.store import Store
from mixprec.bench.table import render_table_rows

_REF = {"sqnr_db": float("inf"), "nonfinite": 0, "weight_bytes": 4096.0, "latency_median": 0.1, "repeat_asked": 5,
        "rounds_left_out": 0}
_FAST = dict(_REF, sqnr_db=41.0, weight_bytes=2048.0, latency_median=0.05)
_TIMES = [0.10, 0.11, 0.10, 0.12, 0.10]

#: name -> (samples, metrics) of a "fast" configuration stored as ok
CASES = {
    "no figure but what was asked": ([0.05] * 5, {"repeat_asked": 5}),
    "fewer timed runs than asked": ([0.05, 0.05], _FAST),
    "no timed run of those asked": ([], _FAST),
    "timed runs without their latency": ([0.05] * 5, {k: v for k, v in _FAST.items() if k != "latency_median"}),
    "a latency without its timed runs": ([], dict(_FAST, repeat_asked=0)),
}


def _run(store: Store, samples, metrics) -> int:
    run_id = store.start_run(pipeline="tts", size="test", machine={"name": "test cpu", "device": "cpu"}, fingerprint="f",
                             versions={"torch": "2"}, notes=[], command="mixprec bench")
    for position, (name, times, figures) in enumerate((("fp32", _TIMES, _REF), ("fast", samples, metrics))):
        config_id = store.add_config(run_id, position=position, name=name, batch=1)
        for index, seconds in enumerate(times):
            store.add_sample(config_id, index, seconds)
        store.finish_config(config_id, status="ok", metrics=figures)
    store.finish_run(run_id, status="complete")
    return run_id


def _measured_and_not(store: Store, case: str) -> tuple[int, int, dict, dict]:
    """A run whose ``fast`` was measured and one whose ``fast`` holds ``case``: their ids, then the runs."""
    good, bad = _run(store, _TIMES[:5], _FAST), _run(store, *CASES[case])
    return good, bad, store.load_run(good), store.load_run(bad)


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_ok_configuration_without_a_measurement_counts_as_not_measured_everywhere(case, tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        _, _, baseline, run = _measured_and_not(store, case)
    fast = next(c for c in run["configs"] if c["name"] == "fast")
    assert runstate.unmeasured(fast) is not None
    assert runstate.failure(fast).startswith("not measured: ")
    assert runstate.classify(run).state == runstate.PARTLY  # fp32 stands; fast did not run to its end
    assert [r["status"] for r in render_table_rows(run)] == ["ok", "not measured"]
    rows = list(csv.DictReader(io.StringIO(export.to_csv([run]))))
    assert [r["status"] for r in rows] == ["ok", "not measured"]
    result = check(run, baseline, Thresholds())
    assert not result.passed and any("fast" in v for v in result.violations), result.violations
    # The same rows, measured: every reader takes them.
    complete = next(c for c in baseline["configs"] if c["name"] == "fast")
    assert runstate.unmeasured(complete) is None and runstate.classify(baseline).state == runstate.COMPLETE


def test_a_run_without_what_was_asked_is_read_as_before():
    """Rows stored before the asked count was kept: ok with their samples is measured."""
    config = {"name": "fast", "batch": 1, "status": "ok", "samples": [0.05] * 3, "metrics": {"sqnr_db": 41.0}}
    assert runstate.unmeasured(config) is None and runstate.shown_status(config) == "ok"


@pytest.mark.parametrize("case", sorted(CASES))
def test_compare_runs_report_and_ui_read_the_rows_too(case, tmp_path):
    """compare, runs list, the HTML report, the JSON export and the web UI say ``not measured`` as the gate does."""
    with Store(tmp_path / "s.sqlite") as store:
        good, bad, baseline, run = _measured_and_not(store, case)
        listed = {row["id"]: row for row in runstate.with_states(store.runs(), store.load_run)}
    (fast,) = [r for r in compare(baseline, run) if r["config"] == "fast"]
    assert fast["status_a"] == "ok" and fast["status_b"] == runstate.NOT_MEASURED and fast["not_measured_b"]
    assert fast["speedup_verdict"] == fast["latency_verdict"] == runstate.NOT_MEASURED and fast["beyond_noise"] is False
    assert listed[bad]["state"] == runstate.PARTLY and listed[bad]["final"] is False and listed[good]["final"] is True
    assert "fast@1 (not measured: " in listed[bad]["state_text"]
    records = json.loads(export.to_json([run]))
    assert [r["status"] for r in records] == ["ok", "not measured"] and {r["run_final"] for r in records} == {False}
    page = report.render_html([run])
    assert '<tr class="not measured">' in page and "Not a final result (partly measured)." in page
    assert render_table_rows(run)[1]["error"] == runstate.unmeasured(fast_config(run))
    bench_tab = pytest.importorskip("mixprec.ui.bench_tab")  # the UI needs gradio
    assert "| fast | 未测量 |" in bench_tab.results_table(run, "zh")
    assert "| fast | not measured |" in bench_tab.results_table(run, "en")


def fast_config(run):
    return next(c for c in run["configs"] if c["name"] == "fast")


def _being_written(store: Store) -> int:
    """A run as another process leaves it while it writes: fp32 finished, ``fast`` still running with one of
    its timed runs stored, and no ``finish_run`` yet."""
    run_id = store.start_run(pipeline="tts", size="test", machine={"name": "test cpu", "device": "cpu"}, fingerprint="f",
                             versions={"torch": "2"}, notes=[], command="mixprec bench")
    ref = store.add_config(run_id, position=0, name="fp32", batch=1)
    for index, seconds in enumerate(_TIMES):
        store.add_sample(ref, index, seconds)
    store.finish_config(ref, status="ok", metrics=_REF)
    fast = store.add_config(run_id, position=1, name="fast", batch=1)
    store.add_sample(fast, 0, 0.05)
    return run_id


def test_a_run_another_process_is_still_writing_is_not_final_for_any_reader(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        good = _run(store, _TIMES[:5], _FAST)
        writing = _being_written(store)
        run, baseline = store.load_run(writing), store.load_run(good)
        listed = {row["id"]: row for row in runstate.with_states(store.runs(), store.load_run)}
    state = runstate.classify(run)
    assert state.state == runstate.INTERRUPTED and not state.final and not state.usable
    assert "fast@1 still marked running: a benchmark is still writing it" in state.text
    result = check(run, baseline, Thresholds())  # the gate cannot decide on it
    assert not result.passed and any(f"run {writing} cannot be gated: interrupted: " in u for u in result.unusable)
    rows = compare(baseline, run)  # compare says the same of every row
    assert rows and all(r["state_b"] == runstate.INTERRUPTED and r["final_b"] is False for r in rows)
    assert listed[writing]["final"] is False and listed[writing]["state"] == runstate.INTERRUPTED
    assert {r["run_final"] for r in json.loads(export.to_json([run]))} == {False}
    assert "Not a final result (interrupted)." in report.render_html([run])


def test_the_rows_say_a_run_is_unfinished_whatever_its_status(tmp_path):
    """A run marked complete whose rows still hold a running configuration is not a final result."""
    with Store(tmp_path / "s.sqlite") as store:
        run_id = _being_written(store)
        store.finish_run(run_id, status="complete")
        run = store.load_run(run_id)
    assert runstate.classify(run).state == runstate.INTERRUPTED and not runstate.classify(run).final


def test_a_gate_over_50000_configurations_names_a_few_and_counts_the_rest():
    """Every message about many configurations (the failure rate, those missing from the run, the run's state)
    names five and counts the rest: a run of 50,000 configurations is judged in a few short lines."""
    def config(name, status="ok", samples=(0.1, 0.1, 0.1)):
        return {"name": name, "batch": 1, "status": status, "error": None, "samples": list(samples),
                "metrics": {"sqnr_db": 40.0, "latency_median": 0.1, "nonfinite": 0}}

    many = [f"policy-{i}.toml" for i in range(50_000)]
    machine = {"name": "test cpu", "device": "cpu"}
    run = {"id": 2, "status": "complete", "machine": machine, "configs": [config("fp32")] + [config(n, "timeout", ()) for n in many]}
    baseline = {"id": 1, "status": "complete", "machine": machine, "configs": [config("fp32")] + [config(n) for n in many]
                + [config(f"gone-{i}") for i in range(50_000)]}
    result = check(run, baseline, Thresholds())
    assert not result.passed
    said = result.unusable + result.violations + result.notes + [runstate.classify(run).text]
    assert all(len(line) < 1000 for line in said), [len(line) for line in said]
    assert any("and 49,995 more" in line for line in result.violations), result.violations
    assert any("gone-0@1, gone-1@1" in line and "and 49,995 more" in line for line in result.violations)


def test_the_compare_and_runs_commands_say_it(tmp_path, clean_env):
    from typer.testing import CliRunner

    from mixprec.cli import app

    db = tmp_path / "s.sqlite"
    with Store(db) as store:
        good, bad, _, _ = _measured_and_not(store, "fewer timed runs than asked")
        writing = _being_written(store)
    cli = CliRunner()
    said = " ".join(cli.invoke(app, ["compare", str(good), str(bad), "--db", str(db)]).stdout.split())
    assert f"not measured in run {bad} (marked ok, but its stored rows hold no measurement): fast@1 (2 of 5 timed runs" in said
    assert f"not a final result: run {bad}: partly measured: " in said
    said = " ".join(cli.invoke(app, ["compare", str(good), str(writing), "--db", str(db)]).stdout.split())
    assert f"not a final result: run {writing}: interrupted: fast@1 still marked running" in said
    listed = " ".join(cli.invoke(app, ["runs", "list", "--db", str(db)]).stdout.split())
    assert f"run {bad}: partly measured: " in listed and f"run {writing}: interrupted: " in listed
