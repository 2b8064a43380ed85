"""Local worker processes: progress messages before an answer reach the caller in order (or are
skipped), and a worker starts with the environment the executor adds, the caller's own winning."""

from __future__ import annotations

import os

import pytest

from executor_helpers import environ_and_progress
from mixprec.measure.executor import LocalProcessExecutor


@pytest.fixture(scope="module")
def worker():
    started = LocalProcessExecutor().start(environ_and_progress, {"name": "progress"})
    started.wait_ready(120)
    yield started
    started.close()


class TestProgressMessages:
    @pytest.mark.parametrize("n", [0, 1, 7, 200])
    def test_each_progress_message_reaches_the_callback_in_order_before_the_answer(self, worker, n):
        seen = []
        assert worker.request("count", {"n": n}, timeout=60, on_progress=seen.append) == "counted"
        assert seen == [{"done": i + 1, "total": n} for i in range(n)]

    @pytest.mark.parametrize("n", [0, 5])
    def test_without_a_callback_they_are_skipped_and_the_answer_comes(self, worker, n):
        assert worker.request("count", {"n": n}, timeout=60) == "counted"
        assert worker.request("count", {"n": 1}, timeout=60) == "counted"  # nothing left over for the next request


class TestWorkerEnvironment:
    NAME = "MIXPREC_TEST_WORKER_VARIABLE"

    @pytest.mark.parametrize("own", [None, "from the caller"])
    def test_the_added_variables_reach_the_worker_and_the_callers_own_value_wins(self, monkeypatch, own):
        if own is None:
            monkeypatch.delenv(self.NAME, raising=False)
        else:
            monkeypatch.setenv(self.NAME, own)
        before = dict(os.environ)
        started = LocalProcessExecutor(env={self.NAME: "added", "OMP_WAIT_POLICY": "PASSIVE"}).start(
            environ_and_progress, {"name": "env"})
        try:
            started.wait_ready(120)
            seen = started.request("env", [self.NAME, "OMP_WAIT_POLICY"], timeout=60)
        finally:
            started.close()
        assert seen[self.NAME] == (own or "added")
        assert seen["OMP_WAIT_POLICY"] == os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
        assert dict(os.environ) == before  # this process's environment is as it was

    def test_a_default_executor_starts_every_worker_with_worker_env(self, monkeypatch):
        """Measuring workers wait passively in OpenMP unless told otherwise: bench's, calibrate's and
        the tuner's executors all take this default; ``env={}`` adds nothing."""
        from mixprec.measure.executor import WORKER_ENV

        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
        seen = {}
        for label, executor in (("default", LocalProcessExecutor()), ("none", LocalProcessExecutor(env={}))):
            started = executor.start(environ_and_progress, {"name": label})
            try:
                started.wait_ready(120)
                seen[label] = started.request("env", list(WORKER_ENV), timeout=60)
            finally:
                started.close()
        assert seen == {"default": dict(WORKER_ENV), "none": dict.fromkeys(WORKER_ENV)}
