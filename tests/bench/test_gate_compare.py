"""``compare`` on stored runs: a change is called only where the intervals support it.

The two cases seen on a busy 2-core machine: fp32 2.5% slower flagged "beyond noise",
and a configuration 20x slower flagged as not.
"""

from __future__ import annotations

from typer.testing import CliRunner

from mixprec.bench.gate import compare
from mixprec.bench.store import Store
from mixprec.cli import app
from stored_runs import jitter, machine_load, store_run

ROUNDS = 10


def _run(store, speedups, *, load=None, base=1.0, seed=0, quality=40.0):
    """fp32 and one configuration per (name, per-round speed-ups), timed in the same rounds."""
    load = load or [1.0] * ROUNDS
    fp32 = jitter([base * f for f in load], 0.01, seed=seed)
    configs = [("fp32", fp32, {"sqnr_db": float("inf"), "nonfinite": 0})]
    for index, (name, ratios) in enumerate(speedups.items()):
        ratios = ratios if isinstance(ratios, list) else [ratios] * ROUNDS
        samples = jitter([t / r for t, r in zip(fp32, ratios)], 0.01, seed=seed + 10 + index)
        configs.append((name, samples, {"sqnr_db": quality, "nonfinite": 0}))
    return store_run(store, configs)


def _rows(store, a, b):
    return {r["config"]: r for r in compare(store.load_run(a), store.load_run(b))}


def test_fp32_slower_by_the_machine_is_not_a_change_of_any_configuration(tmp_path):
    with Store(tmp_path / "c.sqlite") as store:
        a = _run(store, {"balanced": 1.4})
        b = _run(store, {"balanced": 1.4}, base=1.025, seed=1)  # the whole machine 2.5% slower
        rows = _rows(store, a, b)
    fp32, balanced = rows["fp32"], rows["balanced"]
    assert fp32["speedup_verdict"] == "reference" and not fp32["beyond_noise"]
    assert balanced["speedup_verdict"] == "within noise" and not balanced["beyond_noise"]
    assert 0.02 < fp32["latency_change"] < 0.03


def test_a_configuration_twenty_times_slower_is_beyond_noise_even_when_latencies_overlap(tmp_path):
    with Store(tmp_path / "c.sqlite") as store:
        # Run A on a machine whose load moved each round up to 30x: its latency interval
        # is wide enough to hold run B's, but the paired rounds say 1.4x vs 0.068x fp32.
        a = _run(store, {"balanced": 1.4}, load=machine_load(ROUNDS, seed=8, high=30.0))
        b = _run(store, {"balanced": 0.068}, seed=2)
        rows = _rows(store, a, b)
    balanced = rows["balanced"]
    assert balanced["latency_change"] > 1.0
    assert balanced["latency_verdict"] == "undecided on this machine"
    assert balanced["speedup_verdict"] == "slower" and balanced["beyond_noise"]
    assert balanced["speedup_b"]["high"] < balanced["speedup_a"]["low"]


def test_a_noisy_measurement_is_undecided_not_a_winner(tmp_path):
    noisy = [2.6, 1.0, 2.4, 1.1, 2.5, 0.95, 2.2, 1.2, 2.3, 1.05]  # median 1.7 against a steady 1.4
    with Store(tmp_path / "c.sqlite") as store:
        a = _run(store, {"fast": 1.4})
        b = _run(store, {"fast": noisy}, seed=3)
        rows = _rows(store, a, b)
    fast = rows["fast"]
    assert fast["speedup_b"]["value"] > 1.5  # the medians alone would call it faster
    assert fast["speedup_verdict"] == "undecided on this machine" and not fast["beyond_noise"]


def test_runs_stored_without_paired_metrics_are_paired_by_round(tmp_path):
    with Store(tmp_path / "c.sqlite") as store:
        run_id = store_run(store, [("fp32", [1.0, 9.0, 1.0, 1.0, 1.0, 1.0], {}),
                                   ("fast", {0: 0.5, 2: 0.5, 3: 0.5, 4: 0.5, 5: 0.5}, {})])  # round 1 not timed
        other = store_run(store, [("fp32", [1.0] * 6, {}), ("fast", [0.5] * 6, {})])
        rows = _rows(store, other, run_id)
    assert rows["fast"]["speedup_b"] == {"value": 2.0, "low": 2.0, "high": 2.0, "n": 5, "exact": True}
    assert rows["fast"]["speedup_verdict"] == "within noise"


def test_cli_table_says_what_the_intervals_support(tmp_path):
    db = str(tmp_path / "c.sqlite")
    with Store(db) as store:
        a = _run(store, {"balanced": 1.4, "fast": 1.4})
        b = _run(store, {"balanced": 0.068, "fast": [2.6, 1.0, 2.4, 1.1, 2.5, 0.95, 2.2, 1.2, 2.3, 1.05]}, seed=4)
    out = CliRunner().invoke(app, ["compare", str(a), str(b), "--db", db], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    lines = {line.split("│")[1].strip(): line for line in out.output.splitlines() if line.count("│") > 5}
    assert "reference" in lines["fp32"] and "yes" not in lines["fp32"]
    assert "yes: slower (-95." in lines["balanced"]
    assert "undecided on this machine" in lines["fast"] and "yes" not in lines["fast"]
    assert "undecided on this machine: fast@1" in out.output and "--repeat" in out.output


def test_cli_names_timings_the_runner_flagged_unstable(tmp_path):
    db = str(tmp_path / "c.sqlite")
    steady = [1.0] * 6
    with Store(db) as store:
        a = store_run(store, [("fp32", steady, {"unstable": 0.0}), ("fast", [0.5] * 6, {"unstable": 0.0})])
        b = store_run(store, [("fp32", steady, {"unstable": 0.0}),
                              ("fast", [0.5, 0.9, 0.5, 0.4, 0.5, 0.6], {"unstable": 1.0, "latency_cv": 0.28})])
    out = CliRunner().invoke(app, ["compare", str(a), str(b), "--db", db], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert f"unstable timings in run {b} (see its notes): fast@1" in out.output
    assert f"unstable timings in run {a}" not in out.output


def test_cli_json_is_strict(tmp_path):
    import json

    db = str(tmp_path / "c.sqlite")
    with Store(db) as store:
        a, b = _run(store, {"fast": 1.4}), _run(store, {"fast": 1.4}, seed=5)
    out = CliRunner().invoke(app, ["compare", str(a), str(b), "--db", db, "--json"])
    assert out.exit_code == 0 and "Infinity" not in out.output, out.output
    rows = {r["config"]: r for r in json.loads(out.output)}
    assert rows["fp32"]["quality_a"] == "inf" and rows["fp32"]["speedup_verdict"] == "reference"
    assert rows["fast"]["speedup_verdict"] == "within noise" and rows["fast"]["speedup_b"]["n"] == ROUNDS
