"""Per-session background jobs: progress, errors, cancellation, and independence between sessions."""

from __future__ import annotations

import threading

import pytest

gr = pytest.importorskip("gradio")

from mixprec.ui.jobs import Job, stop_all  # noqa: E402


def test_stream_reports_progress_then_the_result():
    def work(report):
        for i in range(3):
            report(i)
        return "result"

    job = Job()
    events = list(job.stream(work))
    assert events[0][0] == "started" and len(events[0][1]) >= 20  # the run's unguessable id
    assert events[-1] == ("done", "result")
    assert [kind for kind, _ in events[1:-1]] == ["progress"] * (len(events) - 2)
    assert events[-2] == ("progress", 2)  # older events may be skipped, never the newest
    assert job.run_id is None  # the run has ended
    again = list(job.stream(work))
    assert again[0][1] != events[0][1]  # each run its own id


def test_errors_come_back_to_the_session():
    def work(report):
        raise ValueError("budget too small")

    [_started, (kind, exc)] = list(Job().stream(work))
    assert kind == "error" and isinstance(exc, ValueError) and "budget too small" in str(exc)


def test_cancel_sets_the_flag_only_while_running():
    job = Job()
    assert job.cancel() is False and not job.should_stop()
    started, stopped = threading.Event(), []

    def work(report):
        started.set()
        while not job.should_stop():
            report("waiting")
            job.stop.wait(0.01)
        stopped.append(True)
        return "kept"

    for kind, value in job.stream(work):
        if kind == "started":
            assert job.run_id == value
        elif kind == "progress":
            assert job.running
            with pytest.raises(RuntimeError, match="already has a run"):
                next(job.stream(work))  # one run per session at a time
            assert job.cancel() is True
        else:
            assert (kind, value) == ("done", "kept")
    assert started.is_set() and stopped == [True] and not job.running


def test_a_closed_stream_stops_the_work():
    job = Job()
    finished = threading.Event()

    def work(report):
        while not job.should_stop():
            report("tick")
            job.stop.wait(0.01)
        finished.set()

    events = job.stream(work)
    assert next(events)[0] == "started"
    assert next(events)[0] == "progress"
    events.close()  # the browser went away
    assert finished.wait(5) and job.should_stop()


def test_two_sessions_get_their_own_jobs():
    """Through Gradio's own session state: each browser session builds a fresh Job."""
    from gradio.state_holder import SessionState

    from mixprec.ui.app import build_app

    demo = build_app("en")
    states = [block for block in demo.blocks.values() if isinstance(block, gr.State) and isinstance(block.value, Job)]
    assert len(states) == 2  # the Benchmark tab's and the Tune tab's
    first, second = SessionState(demo), SessionState(demo)
    for state in states:
        mine, theirs = first[state._id], second[state._id]
        assert isinstance(mine, Job) and isinstance(theirs, Job) and mine is not theirs
        assert first[state._id] is mine  # the same job for the session's later events
        mine.stop.set()
        assert not theirs.should_stop()
    bench, tune = (first[state._id] for state in states)
    assert bench is not tune
    assert bench.index is second[states[0]._id].index is not tune.index  # a tab's runs are found by id in every session


def test_stop_all_stops_every_running_job_when_the_server_stops():
    """Ctrl-C stops the server; each session's run then ends as a cancel ends it (stored as cancelled)."""
    stopped = []

    def work(job, report):
        report("running")
        while not job.should_stop():
            job.stop.wait(0.01)
        stopped.append(job)
        return "cancelled"

    jobs = [Job(), Job()]
    streams = [job.stream(lambda report, job=job: work(job, report)) for job in jobs]
    for stream in streams:
        assert next(stream)[0] == "started"
    assert stop_all(wait_s=60) == (2, 0)
    assert sorted(map(id, stopped)) == sorted(map(id, jobs)) and not any(job.running for job in jobs)
    assert [list(stream)[-1] for stream in streams] == [("done", "cancelled")] * 2
    assert stop_all(wait_s=60) == (0, 0)  # nothing runs now

