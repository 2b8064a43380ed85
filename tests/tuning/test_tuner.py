"""``mixprec.tune(device=...)``: refused before any worker where this machine lacks the device,
passed to the worker's pipeline factory, and kept with the result and the stored tune run."""

from __future__ import annotations

import warnings

import pytest
import torch

from mixprec.bench.store import Store
from mixprec.tuning import tuner
from mixprec.tuning.evaluators import InProcessEvaluator, WorkerEvaluator
from mixprec.tuning.tuner import tune

from tune_models import inputs as _inputs, model as synthetic_model

QUICK = {"dtypes": ("bf16",), "budget": 12, "local_search": False, "final_rounds": 0, "validation_seeds": 0,
         "progress": False}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_cuda_without_cuda_is_refused_before_a_worker_starts(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    started = []
    monkeypatch.setattr(tuner, "WorkerEvaluator", lambda *a, **k: started.append(k))
    with pytest.raises(ValueError, match=r"device 'cuda': CUDA is not available on this machine"):
        tune("minilm", "cosine>=0.99", size="test", device="cuda", **QUICK)
    assert started == []


def test_the_device_is_kept_with_the_result_and_the_stored_run(tmp_path):
    model = synthetic_model("layer")
    evaluator = InProcessEvaluator(model, _inputs, model, seeds=(0,), repeat=1, name="synthetic-device")
    with Store(tmp_path / "t.sqlite") as store:
        result = tune("synthetic", "sqnr>=30", evaluator=evaluator, store=store, device="cpu", **QUICK)
        [listed] = store.tune_runs()
        stored = store.load_tune_run(listed["id"])
    assert result.device == "cpu" and result.to_dict()["device"] == "cpu"
    assert listed["device"] == "cpu" and stored["result"]["device"] == "cpu"


def test_the_worker_builds_the_pipeline_on_the_device():
    with WorkerEvaluator("minilm", "test", seeds=(0,), repeat=1, timeout=300, device="cpu") as ev:
        assert ev.ready["device"] == "cpu"
        result = tune("minilm", "cosine>=0.99", evaluator=ev, **QUICK)
    assert result.device == "cpu" and result.met


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tune_on_cuda_measures_there():
    result = tune("minilm", "cosine>=0.99", size="test", device="cuda", seeds=(0,), repeat=1, **{**QUICK, "budget": 20})
    assert result.device == "cuda" and result.met
    assert all(c.evaluation.latency_s > 0 for c in result.path)
