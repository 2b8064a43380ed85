"""A baseline the gate cannot compare against leaves the gate unable to decide (never a pass), with the
reason; runs ``compare`` cannot compare raise with the reason. Every kind is checked against a control
that passes."""

from __future__ import annotations

import pytest

from mixprec.bench.comparable import baseline_problems, nothing_in_common
from mixprec.bench.gate import Thresholds, check, compare


def _cfg(name, batch=1, status="ok", nonfinite=0, error=None, timed=True):
    metrics = {} if status != "ok" else {"latency_median": 1.0, "latency_ci_low": 0.99, "latency_ci_high": 1.01,
                                         "snr_db": float("inf") if name == "fp32" else 30.0, "nonfinite": nonfinite}
    if not timed:
        metrics = {k: v for k, v in metrics.items() if not k.startswith("latency")}
    return {"name": name, "batch": batch, "status": status, "error": error, "metrics": metrics, "samples": [], "rounds": []}


def _run(run_id, configs, **fields):
    return {"id": run_id, "pipeline": "tts", "size": "test", "status": "complete", "machine_fingerprint": "f",
            "machine": {"device": "cpu"}, "configs": configs, **fields}


GOOD = [_cfg("fp32"), _cfg("fast")]

#: kind -> (baseline, what the gate says)
BAD_BASELINES = {
    "no configuration": (_run(1, []), "baseline 1 has nothing to compare against (nothing measured: it has no configuration"),
    "every configuration failed": (_run(1, [_cfg("fp32", status="failed",
                                                 error="boom " * 100 + "\nTraceback (most recent call last):\n  File x"),
                                            _cfg("fast", status="timeout")]),
                                   "nothing measured: every configuration failed (fp32@1 (failed: boom boom"),
    "every output non-finite": (_run(1, [_cfg("fp32", nonfinite=1), _cfg("fast", nonfinite=3)]),
                                "every configuration failed (fp32@1 (non-finite output), fast@1"),
    "fp32 failed": (_run(1, [_cfg("fp32", status="failed"), _cfg("fast")]),
                    "reference failed: its fp32 reference did not run at batch 1"),
    "fp32 only at another batch": (_run(1, [_cfg("fp32", batch=2), _cfg("fast", batch=1), _cfg("fast", batch=2)]),
                                   "its fp32 reference did not run at batch 1"),
    "no common batch": (_run(1, [_cfg("fp32", batch=2), _cfg("fast", batch=2)]), "no batch in common: run has [1], baseline [2]"),
    "another pipeline": (_run(1, GOOD, pipeline="diffusion"), "run 2 is pipeline 'tts', baseline 1 is 'diffusion'"),
    "another size": (_run(1, GOOD, size="default"), "run 2 is size 'test', baseline 1 is 'default'"),
    "another device": (_run(1, GOOD, machine={"device": "cuda"}), "measured on another device: run 2 on cpu, baseline 1 on cuda"),
    "another machine": (_run(1, GOOD, machine_fingerprint="g"), "measured on another machine (fingerprint f vs g)"),
    "interrupted": (_run(1, GOOD, status="incomplete"), "interrupted: it never finished"),
    "cancelled": (_run(1, GOOD, status="cancelled"), "cancelled: stopped by a Cancel"),
    "runner failed": (_run(1, GOOD, status="failed"), "runner failed: the benchmark runner itself failed"),
    "unknown status": (_run(1, GOOD, status="paused"), "unknown status: its status 'paused' is not one"),
    "no timed run": (_run(1, [_cfg("fp32", timed=False), _cfg("fast", timed=False)]), "no timed rounds"),
}


class TestBaselines:
    def test_the_control_passes(self):
        assert check(_run(2, GOOD), _run(1, GOOD), Thresholds()).violations == []
        assert baseline_problems(_run(2, GOOD), _run(1, GOOD)) == []

    @pytest.mark.parametrize("kind", sorted(BAD_BASELINES))
    def test_a_baseline_that_holds_the_run_to_nothing_leaves_the_gate_undecided_with_the_reason(self, kind):
        baseline, reason = BAD_BASELINES[kind]
        result = check(_run(2, GOOD), baseline, Thresholds(max_failure_rate=1.0), allow_different_machine=False)
        assert not result.passed and result.violations == []  # the run itself is fine: the gate cannot decide
        assert any(reason in v for v in result.unusable), result.unusable
        assert all(len(v) < 1000 for v in result.unusable)  # a long error is clipped
        assert "Traceback" not in " ".join(result.unusable)

    def test_a_failed_baseline_fails_whatever_the_thresholds(self):
        baseline = BAD_BASELINES["every configuration failed"][0]
        loose = Thresholds(max_quality_drop=1.0, max_latency_regression=100.0, max_memory_increase=100.0, max_failure_rate=1.0)
        assert not check(_run(2, GOOD), baseline, loose, allow_different_machine=True).passed


#: kind -> (run a, run b, the reason)
NOTHING_IN_COMMON = {
    "batch 1 vs batch 2": (_run(1, GOOD), _run(2, [_cfg("fp32", batch=2), _cfg("fast", batch=2)]),
                           "no batch in common: run 1 was measured at batch 1, run 2 at batch 2"),
    "no configuration in common": (_run(1, [_cfg("fp32")]), _run(2, [_cfg("fast")]),
                                   "no configuration in common at batch 1: run 1 has fp32, run 2 has fast"),
    "an empty run": (_run(1, GOOD), _run(2, []), "run 2 has no configuration"),
    "another pipeline": (_run(1, GOOD), _run(2, GOOD, pipeline="diffusion"), "run 2 is pipeline 'diffusion'"),
}


class TestCompare:
    @pytest.mark.parametrize("kind", sorted(NOTHING_IN_COMMON))
    def test_nothing_to_compare_raises_with_the_reason(self, kind):
        a, b, reason = NOTHING_IN_COMMON[kind]
        with pytest.raises(ValueError) as info:
            compare(a, b)
        assert reason in str(info.value)

    def test_comparable_runs_give_rows(self):
        assert nothing_in_common(_run(1, GOOD), _run(2, GOOD)) is None
        assert [r["config"] for r in compare(_run(1, GOOD), _run(2, GOOD))] == ["fp32", "fast"]
