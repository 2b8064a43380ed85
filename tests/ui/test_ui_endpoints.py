"""The web UI's endpoints, called by name through ``gradio_client`` against the real app served in this process."""

from __future__ import annotations

import html
import json
import re
import socket
import threading
import time
from pathlib import Path

import pytest

gr = pytest.importorskip("gradio")
gradio_client = pytest.importorskip("gradio_client")

import mixprec  # noqa: E402
from mixprec.bench import runner  # noqa: E402
from mixprec.bench.store import Store  # noqa: E402
from mixprec.ui.app import build_app  # noqa: E402
from mixprec.ui.endpoints import ENDPOINTS, endpoint  # noqa: E402
from mixprec.ui.forms import cancel_job  # noqa: E402
from mixprec.ui.i18n import t  # noqa: E402
from mixprec.ui.jobs import Job, JobIndex  # noqa: E402

UI_PAGE = Path(__file__).resolve().parents[2] / "docs" / "ui.md"
#: The endpoints and their parameters, as scripts call them.
STABLE = {
    "initialize_service": ["lang", "matmul", "preset", "upcast_attention"],
    "run_comparison": ["lang", "pipeline", "size", "device", "preset", "upcast_attention", *(f"dtype_{i}" for i in range(8))],
    "diagnose": ["lang", "pipeline", "size", "preset"],
    "run_benchmark": ["lang", "pipeline", "size", "configs", "repeat", "warmup", "device", "path"],
    "cancel_benchmark": ["lang", "run_id"],
    "list_runs": ["lang", "path"],
    "show_run": ["lang", "path", "run"],
    "run_tune": ["lang", "pipeline", "size", "bound", "objective", "budget", "path", "device"],
    "cancel_tune": ["lang", "run_id"],
}
#: How long a test waits for the served app to reach a point (a bound on a hang, never a timing assertion).
WAIT_S = 300


@pytest.fixture(scope="module")
def url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo = build_app("en")
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


def _client(url):
    return gradio_client.Client(url, verbose=False, download_files=False)


def _text(status_html):
    return html.unescape(re.sub(r"<[^>]+>", "", status_html))


def _until(condition, what):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    pytest.fail(f"the app never reached: {what}")


def _run_id(started):
    """The run id of a submitted start, from the first output that carries one."""
    return _until(lambda: next((out[-1] for out in started.outputs() if out[-1]), None), "an output with a run id")


@pytest.fixture
def held(monkeypatch):
    """Benchmarks and searches wait after their first measured run until ``release`` is set, so a Cancel
    always lands while they run (on a loaded machine a short run could otherwise end first)."""
    reached, release = threading.Event(), threading.Event()
    real_bench, real_tune = runner.run_bench, mixprec.tune

    def run_bench(*args, progress, **kwargs):
        def reported(description, n):
            progress(description, n)
            if ": run " in description and not reached.is_set():
                reached.set()
                release.wait(WAIT_S)

        return real_bench(*args, progress=reported, **kwargs)

    def tune(*args, progress, **kwargs):
        def reported(event):
            progress(event)
            if event.work is None and event.evaluations >= 1 and not reached.is_set():
                reached.set()
                release.wait(WAIT_S)

        return real_tune(*args, progress=reported, **kwargs)

    monkeypatch.setattr(runner, "run_bench", run_bench)
    monkeypatch.setattr(mixprec, "tune", tune)
    yield reached, release
    release.set()


def test_every_endpoint_has_its_documented_name(url):
    api = _client(url).view_api(return_format="dict", print_info=False)
    assert set(api["named_endpoints"]) == {f"/{name}" for name in ENDPOINTS}
    assert api["unnamed_endpoints"] == {}
    params = {name[1:]: [p["parameter_name"] for p in info["parameters"]] for name, info in api["named_endpoints"].items()}
    assert params == STABLE  # scripts call these names with these parameters: a change breaks them
    section = UI_PAGE.read_text(encoding="utf-8").split("## Endpoints")[1].split("\n## ")[0]
    for name in ENDPOINTS:
        assert f"`{name}`" in section, f"docs/ui.md's endpoints section does not list the endpoint {name}"
    with pytest.raises(ValueError, match="unknown endpoint name 'run_bench'; the endpoints are: initialize_service"):
        endpoint("run_bench")


def test_the_page_and_store_endpoints_answer_by_name(url, tmp_path, clean_env):
    client = _client(url)
    before = mixprec.snapshot()
    try:
        status = client.predict("en", "high", "none", False, api_name="/initialize_service")
        assert "**Applied.**" in status and "high" in status
    finally:
        mixprec.restore(before)
    fp32_audio, mixed_audio, fp32_image, mixed_image, figures = client.predict(
        "en", "minilm", "test", "cpu", "none", False, api_name="/run_comparison")
    assert "| fp32 reference |" in figures  # embeddings: no audio or image
    assert all(out["visible"] is False for out in (fp32_audio, mixed_audio, fp32_image, mixed_image))
    summary, table, rules = client.predict("en", "minilm", "test", "fast", api_name="/diagnose")
    assert "modules are risky" in summary and '<table id="diagnose-profile">' in table

    db = tmp_path / "runs.sqlite"
    with Store(db) as store:
        run_id = store.start_run(pipeline="minilm", size="test", machine={"cpu": "test"}, fingerprint="x",
                                 versions={"torch": "2"}, notes=[])
        store.finish_run(run_id)
    text, pick = client.predict("en", str(db), api_name="/list_runs")
    assert "| minilm | test |" in text and pick["value"] == run_id
    report = client.predict("en", str(db), run_id, api_name="/show_run")
    assert report.startswith('<iframe id="bench-report-frame"')


def test_a_benchmark_is_cancelled_from_another_session_by_its_run_id(url, tmp_path, held):
    reached, release = held
    starter, other = _client(url), _client(url)
    db = tmp_path / "bench.sqlite"
    started = starter.submit("en", "minilm", "test", ["fp32", "fast"], 40, 1, "cpu", str(db), api_name="/run_benchmark")
    run_id = _run_id(started)
    assert reached.wait(WAIT_S), "the benchmark never measured a timed run"
    # Another session reaches nothing without the id, and nothing with an id that names no run.
    assert _text(other.predict("en", api_name="/cancel_benchmark")) == t("job.idle", "en")
    said = _text(other.predict("en", "not-" + run_id, api_name="/cancel_benchmark"))
    assert said.startswith("Nothing cancelled. Run id \"not-") and "leave Run id empty" in said
    # ...nor with the id of a run of the other tab.
    assert "Nothing cancelled." in _text(other.predict("en", run_id, api_name="/cancel_tune"))
    assert _text(other.predict("en", run_id, api_name="/cancel_benchmark")) == t("job.cancelling", "en")
    release.set()
    status, table, _plot, runs, pick, last_id = started.result(timeout=WAIT_S)
    assert "Cancelled." in _text(status) and last_id == ""  # nothing runs any more
    with Store(db) as store:
        run = store.load_run(pick["value"])
    assert run["status"] == "cancelled"
    assert 1 <= sum(len(c["samples"]) for c in run["configs"]) < 80  # stopped early: 2 x 40 timed runs were asked for
    assert "Nothing cancelled." in _text(other.predict("en", run_id, api_name="/cancel_benchmark"))  # it has ended


def test_the_cancel_endpoint_without_an_id_stops_its_own_sessions_benchmark(url, tmp_path, held):
    """What the page's Cancel button does: the session that started the run cancels it."""
    reached, release = held
    client = _client(url)
    db = tmp_path / "bench.sqlite"
    started = client.submit("en", "minilm", "test", ["fp32", "fast"], 40, 1, "cpu", str(db), api_name="/run_benchmark")
    assert reached.wait(WAIT_S), "the benchmark never measured a timed run"
    assert _text(client.predict("en", api_name="/cancel_benchmark")) == t("job.cancelling", "en")
    release.set()
    status, *_, pick, last_id = started.result(timeout=WAIT_S)
    assert "Cancelled." in _text(status) and last_id == ""
    with Store(db) as store:
        assert store.load_run(pick["value"])["status"] == "cancelled"


def test_a_search_is_cancelled_through_the_http_call_route(url, tmp_path, held):
    """A ``/call/<endpoint>`` request has a session of its own: the run id reaches the search."""
    import httpx

    reached, release = held
    client = _client(url)
    started = client.submit("en", "minilm", "test", "cosine>=0.999", "memory", 40, str(tmp_path / "tune.sqlite"), "cpu",
                            api_name="/run_tune")
    run_id = _run_id(started)
    assert reached.wait(WAIT_S), "the search never measured a candidate"
    posted = httpx.post(f"{url}gradio_api/call/cancel_tune", json={"data": ["en", run_id]}, timeout=WAIT_S)
    event = posted.json()["event_id"]
    stream = httpx.get(f"{url}gradio_api/call/cancel_tune/{event}", timeout=WAIT_S).text
    data = json.loads(stream.split("event: complete\ndata: ")[1].split("\n")[0])
    assert _text(data[0]) == t("job.cancelling", "en")
    release.set()
    status, _plot, summary, toml_text, last_id = started.result(timeout=WAIT_S)
    assert "Stopped" in _text(status) and t("tune.cancelled", "en") in summary and last_id == ""
    assert mixprec.Policy.from_toml(toml_text).name == "tuned"


def test_a_run_id_reaches_only_a_run_in_progress_of_its_own_index():
    index = JobIndex()
    mine, theirs, elsewhere = Job(index), Job(index), Job(JobIndex())
    inside, release = threading.Event(), threading.Event()

    def work(report):
        inside.set()
        release.wait(WAIT_S)
        return "kept"

    events = theirs.stream(work)
    kind, run_id = next(events)
    assert kind == "started" and theirs.run_id == run_id and index.find(run_id) is theirs
    assert inside.wait(WAIT_S)
    assert t("job.idle", "zh") in cancel_job("zh", mine)  # no id: this session's job, idle
    assert "Nothing cancelled." in _text(cancel_job("en", elsewhere, run_id))  # another tab's index
    said = _text(cancel_job("en", mine, "x" * 10_000))
    assert "(10,000 characters)" in said and len(said) < 1_000
    assert not theirs.should_stop()  # none of that reached the run
    assert t("job.cancelling", "he") in cancel_job("he", mine, f"  {run_id} ")
    assert theirs.should_stop()
    release.set()
    assert list(events)[-1] == ("done", "kept")
    assert theirs.run_id is None and index.find(run_id) is None
    assert "Nothing cancelled." in _text(cancel_job("en", mine, run_id))  # the run has ended
