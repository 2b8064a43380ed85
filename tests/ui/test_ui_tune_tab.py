"""The Tune tab's handlers, called directly: a real search on the test-size minilm pipeline."""

from __future__ import annotations

import re

import pytest

gr = pytest.importorskip("gradio")

import mixprec  # noqa: E402
from mixprec.bench.store import Store  # noqa: E402
from mixprec.ui.i18n import t  # noqa: E402
from mixprec.ui.jobs import Job  # noqa: E402
from mixprec.ui.tune_tab import tune_cancel, tune_plot_png, tune_run  # noqa: E402

UNCHANGED = {"__type__": "update"}
BOUND = "cosine>=0.999"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    db = tmp_path_factory.mktemp("tune") / "tune.sqlite"
    job = Job()
    outputs = list(tune_run("en", "minilm", "test", BOUND, "latency", 16, str(db), job))
    return outputs, db, job


def test_search_streams_a_growing_plot_then_the_result(tuned):
    outputs, db, job = tuned
    first, *progress, last = outputs
    assert "Starting the measuring worker" in first[0] and first[1:] == ["", "", ""]
    assert progress, "no progress was shown"
    # while a step runs the status says what it is and how far, and the plot stays
    working = [out for out in progress if out[1] == UNCHANGED]
    assert "now: starting a worker and building the minilm pipeline (test size)" in working[0][0]
    assert any("now: fp32 reference: 1/2 runs (50%), about" in out[0] for out in working)
    assert any("now: measuring #0 baseline fp32: 2/" in out[0] for out in working)
    # each candidate redraws the plot
    candidates = [out for out in progress if out[1] != UNCHANGED]
    # The stream shows the newest event whenever new ones arrived: on a busy machine the first
    # candidate's event may be overtaken by the second's before it is shown, so no count is fixed.
    first_shown = re.search(r"Evaluation (\d+) of 16 · best so far: #\d+ \(", candidates[0][0])
    assert first_shown, candidates[0][0]
    if first_shown.group(1) == "1":  # shown before the next one arrived: the baseline is the only one measured
        assert "baseline fp32" in candidates[0][0]
    plots = [out[1] for out in candidates]
    assert all(p.startswith('<img id="tune-plot-img"') for p in plots)
    assert len(set(plots)) == len(plots)  # the plot changes as candidates arrive
    assert all(out[2:] == [UNCHANGED, UNCHANGED] for out in progress)

    status, plot, summary, toml_text = last
    assert "<strong>Finished</strong>" in status and plot.startswith('<img id="tune-plot-img"')
    assert "Green meets cosine&gt;=0.999" in plot
    assert summary.startswith("**Bound cosine>=0.999 met.** Chosen: #")
    assert "| No. | Step | Latency (ms) | Weights (MiB) | cosine | Meets the bound |" in summary
    assert "**Validation** on seeds 2, 3, 4, never used by the search: the chosen policy meets cosine>=0.999" in summary
    assert "The search worked to cosine>=0.999206 (1 dB margin) on seeds 0, 1." in summary
    assert "| Metric | Worst | Median | Spread | Seeds |" in summary and "| cosine | " in summary
    policy = mixprec.Policy.from_toml(toml_text)
    assert policy.name == "tuned" and policy.rules
    assert not job.running and not job.should_stop()
    with Store(db) as store:
        [stored] = store.tune_runs()
    assert stored["pipeline"] == "minilm" and stored["bound"] == BOUND and stored["met"]
    assert stored["device"] == "cpu"  # the form's default device, kept with the run


def _colour_present(png: bytes, hex_colour: str) -> bool:
    import io

    import numpy as np
    from matplotlib.image import imread

    pixels = imread(io.BytesIO(png))[..., :3]
    want = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return bool((np.abs(pixels - want).max(axis=-1) < 0.02).any())


def test_plot_colours_met_and_missed_candidates():
    from mixprec.tuning.candidates import Candidate, Evaluation

    bound = mixprec.parse_bound("snr>=30")
    policy = mixprec.Policy(rules=())

    def cand(index, snr):
        met = snr >= 30
        return Candidate(index, f"step {index}", policy, Evaluation(0.01 * (index + 1), 1e6, {"snr_db": snr}), met,
                         0.0 if met else 30 - snr)

    path = [cand(0, float("inf")), cand(1, 20.0), cand(2, 35.0), cand(3, float("nan"))]
    one, both = tune_plot_png(path[:1], bound), tune_plot_png(path, bound, best=path[2])
    assert one.startswith(b"\x89PNG") and one != both
    assert _colour_present(both, "#2a9d8f") and _colour_present(both, "#e76f51")  # met, missed
    assert _colour_present(both, "#264653")  # the ring around the best
    assert not _colour_present(one, "#e76f51")
    assert tune_plot_png([], bound).startswith(b"\x89PNG")


def test_bad_bound_is_shown_inline_and_starts_nothing(tmp_path):
    db = tmp_path / "tune.sqlite"
    job = Job()
    outputs = list(tune_run("en", "minilm", "test", "cosine=>0.9", "latency", 16, str(db), job))
    assert len(outputs) == 1
    status, *rest = outputs[0]
    text = status.replace("&#x27;", "'").replace("&lt;", "<").replace("&gt;", ">")
    assert "<strong>Not started.</strong> The quality bound is not valid" in text
    assert "'cosine=>0.9'" in text and "'<metric> <op> <number>' with op one of >=, >, <=, <" in text
    assert rest == [UNCHANGED] * 3 and not db.exists() and not job.running


@pytest.mark.parametrize(("objective", "budget", "needle"), [
    ("speed", 16, '"speed" is not a valid value for Objective; choose one of: latency, memory'),
    ("latency", 0, 'Budget must be a whole number from 1 to 10000; got "0"'),
    ("latency", None, 'Budget must be a whole number from 1 to 10000; got ""'),
])
def test_invalid_values_start_nothing(tmp_path, objective, budget, needle):
    db = tmp_path / "tune.sqlite"
    [[status, *_]] = tune_run("en", "minilm", "test", BOUND, objective, budget, str(db), Job())
    assert needle in status.replace("&quot;", '"') and not db.exists()


def test_a_device_this_machine_lacks_starts_nothing(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    db = tmp_path / "tune.sqlite"
    [[status, *_]] = tune_run("en", "minilm", "test", BOUND, "latency", 16, str(db), Job(), device="cuda")
    assert '"cuda" is not a valid value for Device; choose one of: cpu' in status.replace("&quot;", '"')
    assert not db.exists()


def test_cancel_stops_the_search_and_keeps_what_was_measured(tmp_path, monkeypatch):
    import threading

    # The search waits after its first measured candidate until Cancel was pressed: on a
    # loaded machine it could otherwise finish before this thread reads its first event.
    real_tune, pressed = mixprec.tune, threading.Event()

    def tune(*args, progress, **kwargs):
        def reported(event):
            progress(event)
            if event.work is None and event.evaluations >= 1:
                pressed.wait(timeout=120)

        return real_tune(*args, progress=reported, **kwargs)

    monkeypatch.setattr(mixprec, "tune", tune)
    db = tmp_path / "tune.sqlite"
    job = Job()
    said, outputs = None, []
    try:
        for out in tune_run("zh", "minilm", "test", BOUND, "memory", 40, str(db), job):
            outputs.append(out)
            if said is None and job.running and out[1] != UNCHANGED and "次评估" in out[0]:  # after the first measured candidate
                said = tune_cancel("zh", job)
                pressed.set()
    finally:
        pressed.set()
    assert said is not None and t("job.cancelling", "zh") in said
    status, _plot, summary, toml_text = outputs[-1]
    assert "已停止" in status and t("tune.cancelled", "zh") in summary
    assert mixprec.Policy.from_toml(toml_text).name == "tuned"
    with Store(db) as store:
        [stored] = store.tune_runs()
    assert 1 <= stored["evaluations"] < 40
