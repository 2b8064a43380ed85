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
    bigger = gate(_run(mem=101 * 2**20), base, Thresholds())
    assert any("peak_mem_bytes" in v for v in bigger)
    broken = gate(_run(status="failed"), base, Thresholds())
    assert any(v.startswith("failure rate 50.0%") and "fast@1 (failed)" in v for v in broken)
    nan = gate(_run(nonfinite=3), base, Thresholds())
    assert any("non-finite output" in v for v in nan)


def test_parse_percent():
    assert parse_percent("5%", "--x") == pytest.approx(0.05)
    assert parse_percent("0.1", "--x") == pytest.approx(0.1)
    with pytest.raises(ValueError, match="--max-latency-regression 'ten': expected a percentage"):
        parse_percent("ten", "--max-latency-regression")


def test_compare_flags_changes_beyond_noise():
    rows = {r["config"]: r for r in compare(_run(), _run(latency=1.5))}
    assert rows["fast"]["latency_change"] == pytest.approx(0.5) and rows["fast"]["latency_significant"]
    same = {r["config"]: r for r in compare(_run(), _run(latency=1.005))}
    assert not same["fast"]["latency_significant"]


def _store_run(store, latency):
    run_id = store.start_run(pipeline="tts", size="test", machine={"name": "m"}, fingerprint="f", versions={}, notes=[])
    for position, (name, snr) in enumerate((("fp32", float("inf")), ("fast", 30.0))):
        cid = store.add_config(run_id, position=position, name=name, batch=1)
        store.finish_config(cid, status="ok", metrics={"latency_median": latency, "snr_db": snr, "peak_mem_bytes": 1e8, "nonfinite": 0})
    store.finish_run(run_id)
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
