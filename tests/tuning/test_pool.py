"""Parallel evaluation: measuring ahead leaves the search's path, count and answer as they were;
the pool of workers times each candidate against fp32 in its own worker."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mixprec.measure.executor import LocalProcessExecutor
from mixprec.tuning.candidates import Config
from mixprec.tuning.evaluators import InProcessEvaluator
from mixprec.tuning.pool import PoolEvaluator
from mixprec.tuning.tuner import tune

from ray_cluster import ON_THE_CLUSTER
from tune_models import inputs as _inputs, model as synthetic_model

#: A pipeline whose workers import nothing beyond torch and run in well under a millisecond (tests/small_factory.py):
#: the pool's test is about which worker times what against which fp32, not about a real model's numerics.
SMALL = f"{Path(__file__).parents[1] / 'small_factory.py'}:build"


class _Ahead(InProcessEvaluator):
    """A real in-process evaluator that also takes work ahead, as a pool of two workers would.

    One model is measured at a time (applying a policy changes it in place); ``submit``
    queues the measurement on a thread and ``idle`` counts the free slots.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._threads = ThreadPoolExecutor(max_workers=2)
        self._model_lock, self._count = threading.Lock(), threading.Lock()
        self.busy, self.submitted = 0, 0

    def _measure(self, policy):
        try:
            with self._model_lock:
                return InProcessEvaluator.evaluate(self, policy)
        finally:
            with self._count:
                self.busy -= 1

    def idle(self) -> int:
        with self._count:
            return 2 - self.busy

    def submit(self, policy):
        with self._count:
            self.busy += 1
            self.submitted += 1
        return self._threads.submit(self._measure, policy)

    def evaluate(self, policy):
        return self.submit(policy).result()


def _path(result):
    return [(c.step, json.dumps(dataclasses.replace(c.policy, name="x").to_dict(), sort_keys=True)) for c in result.path]


def test_measuring_ahead_changes_neither_the_path_nor_the_count():
    model = synthetic_model("layer")
    kwargs = dict(objective="memory", dtypes=("bf16",), local_search=False, validation_seeds=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = tune("synthetic", "sqnr>=30", evaluator=InProcessEvaluator(model, _inputs, model, repeat=1, name="s"), **kwargs)
        ahead_ev = _Ahead(model, _inputs, model, repeat=1, name="s")
        ahead = tune("synthetic", "sqnr>=30", evaluator=ahead_ev, **kwargs)
    assert any(c.step.startswith("bisect") for c in plain.path)  # group testing ran
    assert _path(ahead) == _path(plain)
    assert ahead.evaluations == plain.evaluations and ahead.keep_fp32 == plain.keep_fp32
    assert ahead.policy == plain.policy
    unused = ahead_ev.submitted - ahead.evaluations
    assert unused > 0  # the galloping's guesses were measured ahead, and some were not needed
    assert any(f"{unused} evaluation(s) measured ahead on idle workers were not needed" in n for n in ahead.notes)
    # the budget counts as before; what is measured ahead is bounded by what the budget had left
    capped_ev = _Ahead(model, _inputs, model, repeat=1, name="s")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        capped = tune("synthetic", "sqnr>=30", evaluator=capped_ev, budget=10, **kwargs)
    assert capped.evaluations <= 10 and capped_ev.submitted <= 10 + 2


class _Recording:
    """Real local worker processes whose answers are kept, in order, as ``(worker, command, payload, answer)``."""

    def __init__(self):
        self.executor, self.answers = LocalProcessExecutor(), []

    def start(self, serve, job):
        worker, answers = self.executor.start(serve, job), self.answers

        class Recorded:
            def wait_ready(self, timeout):
                return worker.wait_ready(timeout)

            def request(self, command, payload=None, *, timeout=None):
                answer = worker.request(command, payload, timeout=timeout)
                answers.append((job["name"], command, payload, answer))
                return answer

            def close(self):
                worker.close()

        return Recorded()


def test_a_pool_of_workers_times_each_candidate_against_its_own_fp32():
    import statistics

    recording = _Recording()
    with PoolEvaluator(SMALL, recording, workers=2, size="test", seeds=(0,), repeat=2, threads=1) as pool:
        assert pool.workers == 2 and pool.idle() == 2
        # the scale: fp32 as the first worker timed it, at least 3 runs
        (first, command, _, samples), = [a for a in recording.answers if a[1] == "tune_time"]
        assert first.startswith("tune-0-") and len(samples) == 3 and pool.reference_s == statistics.median(samples)
        fp32, bf16 = pool.submit(Config("fp32").policy()), pool.submit(Config("bf16").policy())
        fp32, bf16 = fp32.result(timeout=300), bf16.result(timeout=300)
        assert pool.idle() == 2
        assert fp32.quality["sqnr_db"] == float("inf") and 20 < bf16.quality["sqnr_db"] < 100
        assert bf16.memory_bytes < 0.6 * fp32.memory_bytes
        # each candidate is timed against fp32 timed just before it in its own worker, and its latency is
        # that ratio on the first worker's scale
        evals = {json.dumps(p["policy"], sort_keys=True): (name, p, a) for name, c, p, a in recording.answers
                 if c == "tune_eval"}
        for candidate in (fp32, bf16):
            policy = Config("fp32" if candidate is fp32 else "bf16").policy().to_dict()
            name, payload, raw = evals[json.dumps(policy, sort_keys=True)]
            assert payload["paired"] is True and raw["fp32_latency_s"] > 0
            assert candidate.latency_s == pytest.approx(raw["latency_s"] / raw["fp32_latency_s"] * pool.reference_s)
        assert {name for name, _, _ in evals.values()} <= {f"tune-0-{pool.pipeline}", f"tune-1-{pool.pipeline}"}
        assert pool.units() and pool.groups() and pool.risk(Config("bf16").policy())


@ON_THE_CLUSTER
@pytest.mark.skipif(os.environ.get("MIXPREC_HEAVY") != "1", reason="two tune runs on a Ray cluster: set MIXPREC_HEAVY=1")
def test_tune_on_ray_finds_the_policy_the_local_tuner_finds(tmp_path):
    from ray_cluster import two_types

    ray, cluster = two_types()
    common = ["tune", "--pipeline", "minilm", "--size", "test", "--bound", "sqnr>=30", "--objective", "memory", "--json"]
    script = "import sys; from mixprec.cli import main; main(sys.argv[1:])"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    local = subprocess.run([sys.executable, "-c", script, *common, "--db", str(tmp_path / "a.sqlite")],
                           capture_output=True, text=True, env=env, timeout=600)
    remote = subprocess.run([sys.executable, "-c", script, *common, "--db", str(tmp_path / "b.sqlite"), "--executor", "ray",
                             "--ray-address", cluster.address, "--hardware", "beta", "--workers", "2"],
                            capture_output=True, text=True, env=env, timeout=600)
    assert local.returncode == 0, local.stderr[-2000:]
    assert remote.returncode == 0, remote.stderr[-2000:]
    a, b = json.loads(local.stdout), json.loads(remote.stdout)
    assert a["met"] and b["met"]
    # the objective (weight bytes) and the quality follow from the policy alone: the same
    # answer; between policies of equal bytes (a rule that matches nothing, the matmul level)
    # the tie is broken on timing, which a loaded machine can tip either way
    chosen_a, chosen_b = a["path"][a["chosen"]], b["path"][b["chosen"]]
    assert chosen_a["memory_bytes"] == chosen_b["memory_bytes"]
    assert chosen_a["quality"]["sqnr_db"] == pytest.approx(chosen_b["quality"]["sqnr_db"], abs=0.5)
