from __future__ import annotations

import pytest
from typer.testing import CliRunner

from mixprec.bench.gate import Thresholds, compare, gate, parse_percent
from mixprec.bench.store import Store
from mixprec.cli import app


def _run(latency=1.0, snr=30.0, mem=100 * 2**20, status="ok", nonfinite=0, ci=0.01):
    metrics = {"latency_median": latency, "latency_ci_low": latency - ci, "latency_ci_high": latency + ci,
               "snr_db": snr, "peak_mem_bytes": mem, "weight_bytes": 50 * 2**20, "nonfinite": nonfinite}
    return {"configs": [
        {"name": "fp32", "batch": 1, "status": "ok", "metrics": {**metrics, "snr_db": float("inf")}},
        {"name": "fast", "batch": 1, "status": status, "metrics": metrics if status == "ok" else {}},
    ]}


def test_pass_and_each_trigger():
    base = _run()
    assert gate(_run(), base, Thresholds()) == []
    assert gate(_run(latency=1.05), base, Thresholds()) == []  # +5% is within the 10% budget
    slow = gate(_run(latency=1.2), base, Thresholds())
    assert any("fast@batch 1: latency" in v and "+20.0%" in v for v in slow)
    worse = gate(_run(snr=27.0), base, Thresholds())
    assert any("quality snr_db 27.00 vs 30.00 (drop 10.0% > 5.0%)" in v for v in worse)
    bigger = gate(_run(mem=110 * 2**20), base, Thresholds())
    assert any("peak_mem_bytes 110.0 MiB vs 100.0 MiB (+10.0% > 0.0%, and more than the 8 MiB noise floor)" in v
               for v in bigger), bigger
    assert gate(_run(mem=101 * 2**20), base, Thresholds()) == []  # 1 MiB: within the readings' noise
    broken = gate(_run(status="failed"), base, Thresholds())
    assert any(v.startswith("failure rate 50.0%") and "fast@1 (failed)" in v for v in broken)
    nan = gate(_run(nonfinite=3), base, Thresholds())
    assert any("non-finite output" in v for v in nan)


def test_parse_percent():
    assert parse_percent("5%", "--x") == pytest.approx(0.05)
    assert parse_percent(" 150% ", "--x") == pytest.approx(1.5)
    with pytest.raises(ValueError, match="--max-latency-regression 'ten': expected a percentage"):
        parse_percent("ten", "--max-latency-regression")
    # A bare number is ambiguous: 5 was read as 500%.
    with pytest.raises(ValueError, match=r"--max-quality-drop '5': give the unit, for example 5%"):
        parse_percent("5", "--max-quality-drop")
    with pytest.raises(ValueError, match=r"between 0% and 100%"):
        parse_percent("500%", "--max-failure-rate", upper=1.0)
    for bad in ("nan%", "inf%", "-1%"):
        with pytest.raises(ValueError, match="finite percentage"):
            parse_percent(bad, "--x")


def _full(run_id, pipeline="tts", status="complete", fingerprint="f", **kwargs):
    return {**_run(**kwargs), "id": run_id, "pipeline": pipeline, "size": "test", "status": status,
            "machine_fingerprint": fingerprint}


def test_gate_never_passes_what_it_could_not_check():
    base = _full(1)
    assert gate(_full(2), base, Thresholds()) == []
    incomplete = gate(_full(2, status="incomplete"), base, Thresholds())
    assert len(incomplete) == 1 and incomplete[0].startswith("run 2 cannot be gated: interrupted: it never finished")
    other = gate(_full(2, pipeline="diffusion"), base, Thresholds())
    assert any("pipeline 'diffusion', baseline 1 is 'tts'" in v for v in other)
    elsewhere = gate(_full(2, fingerprint="g"), base, Thresholds())
    assert any("another machine" in v and "--allow-different-machine" in v for v in elsewhere)
    assert gate(_full(2, fingerprint="g"), base, Thresholds(), allow_different_machine=True) == []
    fewer = _full(2)
    fewer["configs"] = fewer["configs"][:1]
    assert any("missing from the run: fast@1" in v for v in gate(fewer, base, Thresholds()))
    partial = gate(_full(2) | {"configs": [{**c, "status": "partial"} for c in _full(2)["configs"]]}, base, Thresholds())
    assert any("(partial)" in v for v in partial)


def test_gate_refuses_another_size_a_budget_shortened_run_and_no_batch_in_common():
    base = _full(1)
    assert any("size 'default', baseline 1 is 'test'" in v for v in gate(_full(2) | {"size": "default"}, base, Thresholds()))
    # A run a time budget shortened records its steps in the size: never gated against the full one.
    shortened = gate(_full(2) | {"size": "test (steps=2)"}, base, Thresholds())
    assert any("size 'test (steps=2)'" in v for v in shortened)
    other_batch = _full(2)
    other_batch["configs"] = [{**c, "batch": 4} for c in other_batch["configs"]]
    assert any("no batch in common: run has [4], baseline [1]" in v for v in gate(other_batch, base, Thresholds()))
    failed_base = gate(_full(2), _full(1, status="failed"), Thresholds())
    assert any("baseline 1 has nothing to compare against (runner failed" in v for v in failed_base), failed_base


def test_compare_refuses_different_pipelines():
    with pytest.raises(ValueError, match="cannot compare these runs: run 2 is pipeline 'diffusion'"):
        compare(_full(1), _full(2, pipeline="diffusion"))


def test_compare_flags_changes_beyond_noise():
    rows = {r["config"]: r for r in compare(_run(), _run(latency=1.5))}
    assert rows["fast"]["latency_change"] == pytest.approx(0.5) and rows["fast"]["latency_significant"]
    same = {r["config"]: r for r in compare(_run(), _run(latency=1.005))}
    assert not same["fast"]["latency_significant"]


def _store_run(store, latency, pipeline="tts", status="complete"):
    run_id = store.start_run(pipeline=pipeline, size="test", machine={"name": "m"}, fingerprint="f", versions={}, notes=[])
    for position, (name, snr) in enumerate((("fp32", float("inf")), ("fast", 30.0))):
        cid = store.add_config(run_id, position=position, name=name, batch=1)
        for index, spread in enumerate((-0.004, 0.002, 0.0, -0.001, 0.003)):
            store.add_sample(cid, index, latency * (1 + spread))
        store.finish_config(cid, status="ok", metrics={"latency_median": latency, "snr_db": snr, "peak_mem_bytes": 1e8, "nonfinite": 0})
    store.finish_run(run_id, status=status)
    return run_id


def test_gate_cli_exit_codes(tmp_path):
    db = str(tmp_path / "g.sqlite")
    with Store(db) as store:
        base, same, slow = _store_run(store, 1.0), _store_run(store, 1.0), _store_run(store, 2.0)
    runner = CliRunner()
    ok = runner.invoke(app, ["gate", str(same), "--baseline", str(base), "--db", db])
    assert ok.exit_code == 0 and "gate passed" in ok.output
    bad = runner.invoke(app, ["gate", str(slow), "--baseline", str(base), "--db", db, "--max-latency-regression", "10%"])
    assert bad.exit_code == 1 and "latency 2.0000 s vs 1.0000 s" in bad.output
    missing = runner.invoke(app, ["gate", "99", "--baseline", str(base), "--db", db])
    assert missing.exit_code == 2 and "no run 99" in missing.output
    typo = runner.invoke(app, ["gate", str(same), "--baseline", str(base), "--db", db, "--max-quality-drop", "lots"])
    assert typo.exit_code == 2 and "--max-quality-drop 'lots'" in typo.output
    bare = runner.invoke(app, ["gate", str(same), "--baseline", str(base), "--db", db, "--max-quality-drop", "5"])
    assert bare.exit_code == 2 and "give the unit" in bare.output
    rate = runner.invoke(app, ["gate", str(same), "--baseline", str(base), "--db", db, "--max-failure-rate", "500%"])
    assert rate.exit_code == 2 and "between 0% and 100%" in rate.output
    with Store(db) as store:
        other = _store_run(store, 1.0, pipeline="diffusion")
    refused = runner.invoke(app, ["compare", str(base), str(other), "--db", db])
    assert refused.exit_code == 2 and "cannot compare these runs" in refused.output
    different = runner.invoke(app, ["gate", str(other), "--baseline", str(base), "--db", db])
    assert different.exit_code == 2 and "gate cannot decide" in different.stderr and "pipeline 'diffusion'" in different.stderr
    with Store(db) as store:
        unfinished = {status: _store_run(store, 1.0, status=status) for status in ("incomplete", "cancelled", "failed")}
    states = {"incomplete": "interrupted: it never finished", "cancelled": "cancelled: stopped by a Cancel",
              "failed": "runner failed: the benchmark runner itself failed"}
    for status, run_id in unfinished.items():
        as_run = runner.invoke(app, ["gate", str(run_id), "--baseline", str(base), "--db", db])
        assert as_run.exit_code == 2 and f"run {run_id} cannot be gated: {states[status]}" in as_run.stderr, as_run.output
        as_base = runner.invoke(app, ["gate", str(same), "--baseline", str(run_id), "--db", db])
        assert as_base.exit_code == 2 and f"baseline {run_id} has nothing to compare against ({states[status]}" \
            in as_base.stderr.replace("\n", " "), as_base.output
