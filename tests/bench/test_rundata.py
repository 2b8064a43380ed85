"""A run's device, and what ``compare``, the gate, the hardware matrix and the run list do with it:
a CPU run and a CUDA run of one host are never one machine."""

from __future__ import annotations

from typer.testing import CliRunner

from mixprec.bench import evidence, rundata
from mixprec.bench.gate import Thresholds, check, compare
from mixprec.bench.matrix import hardware_matrix, spans_machines
from mixprec.bench.store import Store
from mixprec.cli import app
from stored_runs import jitter, store_run

ROUNDS = 8


def _run(store, *, device, fp32_s, fast_speedup, fingerprint="f"):
    """fp32 and ``fast`` timed in the same rounds; one fingerprint for both devices unless told,
    so only the device can keep them apart."""
    fp32 = jitter([fp32_s] * ROUNDS, 0.01, seed=1)
    fast = jitter([s / fast_speedup for s in fp32], 0.01, seed=2)
    quality = {"sqnr_db": 40.0, "nonfinite": 0}
    return store_run(store, [("fp32", fp32, {"sqnr_db": float("inf"), "nonfinite": 0}), ("fast", fast, quality)],
                     fingerprint=fingerprint, device=device)


def test_the_device_is_read_from_the_run_and_from_runs_stored_before_it():
    assert rundata.device({"machine": {"device": "cuda:1", "device_type": "cuda"}}) == "cuda:1"
    assert rundata.device({"machine": {"device_type": "cpu"}}) == "cpu"  # stored before the device was
    assert rundata.device({"machine": {"name": "x"}}) is None and rundata.device({}) is None
    cpu, gpu, gpu1 = ({"machine": {"device": d}} for d in ("cpu", "cuda", "cuda:1"))
    assert rundata.devices_differ(cpu, gpu) == ("cpu", "cuda")
    assert rundata.devices_differ(gpu, gpu1) is None and rundata.devices_differ(cpu, {}) is None


def test_compare_across_devices_judges_no_latency_and_says_so(tmp_path):
    db = tmp_path / "d.sqlite"
    with Store(db) as store:
        cpu = _run(store, device="cpu", fp32_s=1.0, fast_speedup=1.5)
        gpu = _run(store, device="cuda", fp32_s=0.05, fast_speedup=1.5)
        same = _run(store, device="cpu", fp32_s=0.05, fast_speedup=1.5)
        rows = {r["config"]: r for r in compare(store.load_run(cpu), store.load_run(gpu))}
        alike = {r["config"]: r for r in compare(store.load_run(cpu), store.load_run(same))}
        listed = {r["id"]: r["device"] for r in store.runs()}
    assert listed == {cpu: "cpu", gpu: "cuda", same: "cpu"}
    for row in rows.values():
        # 20x faster in seconds, but on another device: shown, never called a change
        assert row["latency_verdict"] == evidence.OTHER_DEVICE and not row["latency_significant"]
        assert (row["device_a"], row["device_b"]) == ("cpu", "cuda") and row["latency_b"] < row["latency_a"] / 10
    assert rows["fast"]["speedup_verdict"] == evidence.WITHIN_NOISE  # each against its own fp32: that compares
    # the same seconds on one device are a change
    assert alike["fast"]["latency_verdict"] == evidence.FASTER and "device_a" not in alike["fast"]

    result = CliRunner().invoke(app, ["compare", str(cpu), str(gpu), "--db", str(db)])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"different devices: run {cpu} was measured on cpu, run {gpu} on cuda" in said
    assert "never compared as one machine" in said and evidence.OTHER_DEVICE in said
    assert "hardware matrix" in said and "test cpu [f] on cpu" in said and "test cpu [f] on cuda" in said


def test_the_gate_refuses_a_baseline_on_another_device(tmp_path):
    with Store(tmp_path / "g.sqlite") as store:
        gpu = store.load_run(_run(store, device="cuda", fp32_s=0.05, fast_speedup=1.5))
        cpu = store.load_run(_run(store, device="cpu", fp32_s=1.0, fast_speedup=1.5))
    refused = check(cpu, gpu, Thresholds())
    assert any("measured on another device: run" in v and "on cpu, baseline" in v and "on cuda" in v
               and "--allow-different-machine" in v for v in refused.unusable), refused.unusable
    assert not refused.passed
    # allowed: the CPU's seconds are 20x the GPU's, yet only the speed-ups against each run's own fp32 compare
    allowed = check(cpu, gpu, Thresholds(), allow_different_machine=True)
    assert allowed.passed, allowed.violations
    assert any("latency not compared" in u for u in allowed.undecided)


def test_the_matrix_gives_each_device_its_own_column(tmp_path):
    with Store(tmp_path / "m.sqlite") as store:
        runs = [store.load_run(_run(store, device=d, fp32_s=s, fast_speedup=x))
                for d, s, x in (("cpu", 1.0, 1.2), ("cuda", 0.05, 2.0))]
    assert spans_machines(runs)  # one fingerprint, two devices
    (matrix,) = hardware_matrix(runs)
    assert matrix.machines == ["test cpu [f] on cpu", "test cpu [f] on cuda"] and matrix.devices == ["cpu", "cuda"]
    assert matrix.summary()[-1] == ("different devices (cpu, cuda): each column is one device against fp32 on that "
                                    "device; they are never one machine, even on one host")
    (one,) = hardware_matrix([runs[0], runs[0]])
    assert not any("different devices" in line for line in one.summary())
