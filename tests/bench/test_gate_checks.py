"""The gate on stored runs: every case that once passed when it had to fail, and latency decided on intervals.

Runs are written into a real store with synthetic samples (tests/stored_runs.py);
the gate reads them back as ``mixprec gate`` does.
"""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from mixprec.bench.gate import Thresholds, check, parse_bytes, parse_db, thresholds_from_flags
from mixprec.bench.store import Store
from mixprec.cli import app

from stored_runs import jitter, machine_load, store_run

MIB = 2**20
ROUNDS = 12


def _metrics(samples, **extra):
    ordered = sorted(samples)
    return {"latency_median": ordered[len(ordered) // 2], "nonfinite": 0, **extra}


def _pair(fp32, other, *, quality=None, name="fast", other_extra=None, fp32_extra=None):
    """fp32 and one more configuration with the given samples."""
    return [("fp32", fp32, _metrics(fp32, sqnr_db=float("inf"), **(fp32_extra or {}))),
            (name, other, _metrics(other, **({} if quality is None else {"sqnr_db": quality}), **(other_extra or {})))]


def _steady(speedup, *, base=1.0, load=None, spread=0.01, seed=0):
    """fp32 and a configuration ``speedup`` times faster, timed in the same rounds."""
    load = load or [1.0] * ROUNDS
    fp32 = jitter([base * f for f in load], spread, seed=seed)
    return fp32, jitter([t / speedup for t in fp32], spread, seed=seed + 100)


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "gate.sqlite") as s:
        yield s


def _check(store, run, baseline, **flags):
    return check(store.load_run(run), store.load_run(baseline), Thresholds(**flags))


def test_a_drop_from_exact_fails_unless_a_floor_allows_it(store):
    # The policy kept everything in fp32 (exact: inf), then moved to bf16 (48.7 dB).
    fp32, other = _steady(1.0)
    baseline = store_run(store, _pair(fp32, other, quality=float("inf"), name="policy.toml"))
    fp32, other = _steady(1.5)
    run = store_run(store, _pair(fp32, other, quality=48.7, name="policy.toml"))
    assert store.load_run(baseline)["configs"][1]["metrics"]["sqnr_db"] == float("inf")  # inf survives the store
    result = _check(store, run, baseline, max_quality_drop=0.05)
    assert any("policy.toml@batch 1: quality sqnr_db 48.70 dB vs exact (inf) in the baseline" in v
               and "--min-quality" in v for v in result.violations), result.violations
    assert _check(store, run, baseline, min_quality_db=40.0).passed
    below = _check(store, run, baseline, min_quality_db=50.0)
    assert below.violations == ["policy.toml@batch 1: quality sqnr_db 48.70 dB < --min-quality 50.00 dB"]


def test_missing_quality_cannot_pass(store):
    fp32, other = _steady(1.5)
    baseline = store_run(store, _pair(fp32, other, quality=48.7))
    run = store_run(store, _pair(fp32, other, quality=None))
    result = _check(store, run, baseline, max_failure_rate=1.0)
    assert any("fast@batch 1: could not check quality: the baseline has sqnr_db 48.70 dB, the run none" in v
               for v in result.violations), result.violations
    # Counted as a failed configuration too.
    rate = _check(store, run, baseline).violations
    assert any(v.startswith("failure rate 50.0% > 1.0%: fast@1 (no quality figure)") for v in rate), rate


def test_an_output_of_another_shape_is_a_failed_configuration(store):
    fp32, other = _steady(1.5)
    baseline = store_run(store, _pair(fp32, other, quality=48.7))
    # As stored by a runner that only skipped quality ("ok", no figure) ...
    silent = store_run(store, _pair(fp32, other))
    # ... and as the runner stores it now (shape_mismatch, failed).
    marked = store_run(store, _pair(fp32, other, other_extra={"shape_mismatch": 1.0})[:1]
                       + [("fast", other, _metrics(other, shape_mismatch=1.0), "failed")])
    for run in (silent, marked):
        result = _check(store, run, baseline)
        assert not result.passed
        assert any(v.startswith("failure rate 50.0%") for v in result.violations), result.violations
    assert any("(no quality figure)" in v for v in _check(store, silent, baseline).violations)
    marked_ok = store_run(store, _pair(fp32, other, quality=48.7, other_extra={"shape_mismatch": 1.0}))
    assert any("fast@1 (output shape differs from fp32's)" in v for v in _check(store, marked_ok, baseline).violations)


def test_a_run_in_which_everything_failed_fails_whatever_the_rate(store):
    fp32, other = _steady(1.5)
    baseline = store_run(store, _pair(fp32, other, quality=48.7))
    run = store_run(store, [("fp32", [], {}, "failed"), ("fast", [], {}, "failed")])
    result = _check(store, run, baseline, max_failure_rate=1.0)
    assert result.violations == [f"every configuration of run {run} failed, fp32 included: nothing was measured, "
                                 "whatever --max-failure-rate allows"]


def test_memory_noise_floor(store):
    fp32, other = _steady(1.5)
    base_mem = 36.2 * MIB
    baseline = store_run(store, _pair(fp32, other, quality=48.7, other_extra={"peak_mem_bytes": base_mem,
                                                                               "weight_bytes": 50 * MIB}))
    noisy = store_run(store, _pair(fp32, other, quality=48.7, other_extra={"peak_mem_bytes": base_mem + 30_000,
                                                                            "weight_bytes": 50 * MIB}))
    assert _check(store, noisy, baseline, max_memory_increase=0.0).passed
    no_floor = _check(store, noisy, baseline, max_memory_increase=0.0, memory_floor_bytes=0).violations
    assert len(no_floor) == 1
    figures = re.search(r"peak_mem_bytes ([\d.]+) MiB vs ([\d.]+) MiB \(\+([\d.]+)% > ([\d.]+)%\)", no_floor[0])
    assert figures, no_floor
    assert figures.group(1) != figures.group(2) and figures.group(3) != figures.group(4)  # never "36.2 vs 36.2"
    grown = store_run(store, _pair(fp32, other, quality=48.7, other_extra={"peak_mem_bytes": base_mem + 9 * MIB,
                                                                            "weight_bytes": 50 * MIB + 1}))
    violations = _check(store, grown, baseline, max_memory_increase=0.0).violations
    assert any("peak_mem_bytes 45.2 MiB vs 36.2 MiB (+24.9% > 0.0%, and more than the 8 MiB noise floor)" in v
               for v in violations), violations
    # Weight bytes are exact counts: one byte more is an increase, shown with the digits that tell it.
    weights = [v for v in violations if "weight_bytes" in v]
    assert weights and re.search(r"weight_bytes 50\.0+1 MiB vs 50\.0+ MiB", weights[0]), weights
    assert not _check(store, noisy, baseline, max_memory_increase=0.0).undecided


def test_missing_memory_or_timing_cannot_pass(store):
    fp32, other = _steady(1.5)
    baseline = store_run(store, _pair(fp32, other, quality=48.7, other_extra={"peak_mem_bytes": 40 * MIB}))
    run = store_run(store, _pair(fp32, other)[:1] + [("fast", [], {"sqnr_db": 48.7, "nonfinite": 0})])
    violations = _check(store, run, baseline).violations
    assert any("fast@batch 1: could not check peak_mem_bytes" in v for v in violations), violations
    assert any("fast@batch 1: could not check latency" in v for v in violations), violations


def test_a_regression_on_a_busy_machine_still_fails(store):
    # The machine's load moves every round by up to 3x: absolute latencies overlap, but
    # the paired rounds show the configuration went from 2.0x to 1.5x its fp32.
    baseline = store_run(store, _pair(*_steady(2.0, load=machine_load(ROUNDS, seed=2)), quality=48.7))
    run = store_run(store, _pair(*_steady(1.5, load=machine_load(ROUNDS, seed=3)), quality=48.7))
    result = _check(store, run, baseline)
    assert result.violations == [result.violations[0]] and result.violations[0].startswith("fast@batch 1: speed-up vs its "
                                                                                          "fp32 1.50x"), result.violations
    assert "more than 10.0% slower over the whole interval" in result.violations[0]
    # fp32's own latency moved with the load: that one the intervals cannot decide.
    assert [u.split(":")[0] for u in result.undecided] == ["fp32@batch 1"], result.undecided


def test_a_steady_speedup_on_a_busy_machine_passes(store):
    baseline = store_run(store, _pair(*_steady(2.0), quality=48.7))
    run = store_run(store, _pair(*_steady(2.0, load=machine_load(ROUNDS, seed=4, low=1.0, high=1.08)), quality=48.7))
    result = _check(store, run, baseline)
    assert result.passed and not result.undecided, (result.violations, result.undecided)


def test_a_noisy_run_is_undecided_rather_than_passed_or_failed(store, tmp_path):
    baseline = store_run(store, _pair(*_steady(2.0), quality=48.7))
    # Every other round the configuration was caught by another process: the per-round
    # ratios spread from 1.1x to 2.9x. The medians say a 19% regression (1.68x vs 2.0x),
    # which the intervals do not support, nor exclude.
    fp32 = jitter([1.0] * ROUNDS, 0.02, seed=5)
    ratios = [2.9, 1.1, 2.6, 1.2, 2.8, 1.15, 2.5, 1.25, 2.7, 1.3, 2.0, 1.4]
    run = store_run(store, _pair(fp32, [t / r for t, r in zip(fp32, ratios)], quality=48.7,
                                 other_extra={"unstable": 1.0}))
    result = _check(store, run, baseline)
    assert result.passed
    assert "its timings in the run were flagged unstable" in result.undecided[0]
    assert len(result.undecided) == 1 and result.undecided[0].startswith(
        "fast@batch 1: latency regression beyond 10.0% undecided on this machine"), result.undecided
    assert "re-run with more --repeat" in result.undecided[0]
    strict = _check(store, run, baseline, fail_undecided=True)
    assert strict.violations == [result.undecided[0] + " (--fail-undecided)"]
    db = str(store.path)
    out = CliRunner().invoke(app, ["gate", str(run), "--baseline", str(baseline), "--db", db])
    assert out.exit_code == 0 and "gate passed" in out.output and "undecided on this machine" in out.output
    out = CliRunner().invoke(app, ["gate", str(run), "--baseline", str(baseline), "--db", db, "--fail-undecided"])
    assert out.exit_code == 1 and "gate FAILED" in out.output and "(--fail-undecided)" in out.output


def test_fp32_itself_is_judged_by_its_latency_intervals(store):
    baseline = store_run(store, _pair(*_steady(2.0), quality=48.7))
    slower = store_run(store, _pair(*_steady(2.0, base=1.5), quality=48.7))
    violations = _check(store, slower, baseline).violations
    assert any(v.startswith("fp32@batch 1: latency 1.") and "vs 1." in v for v in violations), violations
    fast = [v for v in violations if v.startswith("fast@batch 1")]
    assert fast and "shows no regression: the whole run ran slower" in fast[0], fast


def test_cli_flags(store):
    fp32, other = _steady(1.5)
    baseline = store_run(store, _pair(fp32, other, quality=float("inf")))
    run = store_run(store, _pair(fp32, other, quality=48.7))
    db, runner = str(store.path), CliRunner()
    args = ["gate", str(run), "--baseline", str(baseline), "--db", db]
    exact = runner.invoke(app, args)
    assert exact.exit_code == 1 and "vs exact (inf) in the baseline" in exact.output
    assert runner.invoke(app, [*args, "--min-quality", "40dB"]).exit_code == 0
    for flag, value, message in (("--min-quality", "lots", "--min-quality 'lots': expected decibels"),
                                 ("--min-quality", "inf", "finite number of decibels"),
                                 ("--memory-noise-floor", "8", "--memory-noise-floor '8': give the unit"),
                                 ("--memory-noise-floor", "8 parsecs", "units: B, KiB, MiB"),
                                 ("--memory-noise-floor", "-1MiB", "0 or more")):
        bad = runner.invoke(app, [*args, flag, value])
        assert bad.exit_code == 2 and message in bad.output, bad.output


def test_parsers():
    assert parse_db("40dB", "--x") == 40.0 and parse_db(" 12.5 dB ", "--x") == 12.5 and parse_db("-3", "--x") == -3.0
    assert parse_bytes("8MiB", "--x") == 8 * MIB and parse_bytes("0", "--x") == 0 and parse_bytes("1.5 KB", "--x") == 1500
    assert parse_bytes("2gib", "--x") == 2 * 2**30
    with pytest.raises(ValueError, match="--x 'nan MiB'"):
        parse_bytes("nan MiB", "--x")
    thresholds = thresholds_from_flags(max_quality_drop="5%", max_latency_regression="10%", max_memory_increase="0%",
                                       max_failure_rate="1%", min_quality="30dB", memory_noise_floor="4MiB")
    assert thresholds.min_quality_db == 30.0 and thresholds.memory_floor_bytes == 4 * MIB
    with pytest.raises(ValueError, match="memory_floor_bytes"):
        Thresholds(memory_floor_bytes=-1)


def test_on_another_machine_only_speedups_compare(store):
    baseline = store_run(store, _pair(*_steady(2.0), quality=48.7))
    # A machine twice as slow: every latency doubles, the speed-up against fp32 holds.
    slower_machine = store_run(store, _pair(*_steady(2.0, base=2.0, seed=6), quality=48.7), fingerprint="g")
    result = check(store.load_run(slower_machine), store.load_run(baseline), Thresholds(), allow_different_machine=True)
    assert result.passed, result.violations
    assert result.undecided == ["fp32@batch 1: latency not compared: the run and the baseline were measured on different "
                                "machines (only each configuration's speed-up against its own run's fp32 is)"]
    regressed = store_run(store, _pair(*_steady(1.5, base=2.0, seed=7), quality=48.7), fingerprint="g")
    violations = check(store.load_run(regressed), store.load_run(baseline), Thresholds(),
                       allow_different_machine=True).violations
    assert len(violations) == 1 and violations[0].startswith("fast@batch 1: speed-up vs its fp32 1.50x"), violations
