"""A configuration is judged by its stored rows, not by its status alone: one marked ``ok`` whose rows hold
no measurement (no figure, fewer timed runs than asked, timed runs without figures, a latency without its
timed runs) counts as not measured by every reader: the run's state, the table, the exports and the gate."""

from __future__ import annotations

import csv
import io

import pytest

from mixprec.bench import export, runstate
from mixprec.bench.gate import Thresholds, check
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


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_ok_configuration_without_a_measurement_counts_as_not_measured_everywhere(case, tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        good = _run(store, _TIMES[:5], _FAST)
        bad = _run(store, *CASES[case])
        run, baseline = store.load_run(bad), store.load_run(good)
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
