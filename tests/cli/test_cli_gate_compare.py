"""``mixprec gate`` cannot decide (exit status 2, the reason on stderr, never a pass) against a baseline
that holds the run to nothing, and ``mixprec compare`` says why nothing is comparable (stderr, exit
status 2, and in --json), on runs in a real store."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mixprec.bench.store import Store
from mixprec.cli import app
from stored_runs import store_run

runner = CliRunner()

_OK = {"sqnr_db": 30.0, "nonfinite": 0}
GOOD = [("fp32", [0.1] * 5, {"sqnr_db": float("inf"), "nonfinite": 0}), ("fast", [0.05] * 5, _OK)]

#: kind -> (the other run's configurations, its store_run keywords, the reason gate and compare give)
OTHERS = {
    "every configuration failed": ([("fp32", [], {}, "failed"), ("fast", [], {}, "failed")], {},
                                   "baseline 1 has nothing to compare against (nothing measured: every configuration failed"),
    "fp32 failed": ([("fp32", [], {}, "failed"), ("fast", [0.05] * 5, _OK)], {},
                    "reference failed: its fp32 reference did not run at batch 1"),
    "batch 2": (GOOD, {"batch": 2}, "no batch in common"),
    "another device": (GOOD, {"device": "cuda"}, "measured on another device"),
    "another pipeline": (GOOD, {"pipeline": "diffusion"}, "baseline 1 is 'diffusion'"),
}
#: kinds ``compare`` refuses (the others it shows: a failed run or another device is still a comparison)
COMPARE_REFUSES = {"batch 2": "no batch in common: run 1 was measured at batch 2, run 2 at batch 1",
                   "another pipeline": "run 2 is pipeline 'tts', baseline 1 is 'diffusion'"}


@pytest.fixture
def store_with(tmp_path):
    def make(kind):
        configs, extra, _ = OTHERS[kind]
        path = tmp_path / "s.sqlite"
        with Store(path) as store:
            store_run(store, configs, **{"device": "cpu", **extra})
            store_run(store, GOOD, device="cpu")
        return str(path)
    return make


class TestGateAndCompare:
    @pytest.mark.parametrize("kind", sorted(OTHERS))
    def test_gate_cannot_decide_and_says_why(self, kind, store_with, clean_env):
        result = runner.invoke(app, ["gate", "2", "--baseline", "1", "--max-failure-rate", "100%", "--db", store_with(kind)])
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("error: gate cannot decide: run 2 vs baseline 1") and result.stdout == ""
        assert OTHERS[kind][2] in result.stderr.replace("\n", "") and "Traceback" not in result.output

    @pytest.mark.parametrize("kind", sorted(COMPARE_REFUSES))
    @pytest.mark.parametrize("as_json", [False, True])
    def test_compare_says_why_nothing_is_comparable(self, kind, as_json, store_with, clean_env):
        result = runner.invoke(app, ["compare", "1", "2", "--db", store_with(kind), *(["--json"] if as_json else [])])
        assert result.exit_code == 2, result.output
        assert COMPARE_REFUSES[kind] in result.stderr.replace("\n", "") and result.stderr.startswith("error:")
        if as_json:
            shown = json.loads(result.stdout)
            assert shown["comparable"] is False and shown["rows"] == [] and COMPARE_REFUSES[kind] in shown["reason"]
        else:
            assert result.stdout == ""  # no empty table

    def test_comparable_runs_still_compare(self, store_with, clean_env):
        path = store_with("every configuration failed")
        with Store(path) as store:
            store_run(store, GOOD, device="cpu")
        result = runner.invoke(app, ["compare", "2", "3", "--db", path, "--json"])
        assert result.exit_code == 0, result.output
        assert [r["config"] for r in json.loads(result.stdout)] == ["fp32", "fast"]
        gate = runner.invoke(app, ["gate", "3", "--baseline", "2", "--db", path])
        assert gate.exit_code == 0 and "gate passed" in gate.stdout
