"""Shared fixtures: every test starts and ends with torch's numeric flags untouched."""

from __future__ import annotations

import pytest

from mixprec import backends


@pytest.fixture(autouse=True)
def _isolate_torch_flags():
    before = backends.snapshot()
    yield
    backends.restore(before)


@pytest.fixture(autouse=True)
def _isolate_cache(tmp_path_factory, monkeypatch):
    # Probe results go to a per-session cache so tests never touch the user's cache.
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "mixprec-cache"))


@pytest.fixture
def clean_env(monkeypatch):
    """An environment without MIXPREC_* or test-app variables."""
    import os

    for name in list(os.environ):
        if name.startswith(("MIXPREC_", "MYAPP_", "ACE_STEP_")) and name != "MIXPREC_CACHE_DIR":
            monkeypatch.delenv(name)
    return monkeypatch
