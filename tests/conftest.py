"""Shared fixtures: every test starts and ends with torch's numeric flags untouched."""

from __future__ import annotations

import pytest
from hypothesis import settings

from probe_helpers import decided

from mixprec.device import backends

# Property tests draw the same examples on every run: a verdict must not depend on which
# random inputs a run happened to draw (cases found once are kept as explicit examples).
settings.register_profile("mixprec", derandomize=True)
settings.load_profile("mixprec")


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


@pytest.fixture
def bf16_cpu(tmp_path, monkeypatch):
    """This machine as a CPU whose probe measured bf16 fast (as on avx512_bf16 or AMX parts).

    Presets follow the measured probe, so a test of what a preset does with 16-bit
    types would otherwise depend on the machine running it. This measures the real
    probe into a private cache, then rewrites the cached bf16 entry as fast; every
    later ``probe()`` (benchmark workers included, through ``MIXPREC_CACHE_DIR``)
    reads that description.
    """
    import dataclasses
    import json

    from mixprec import hardware

    cache = tmp_path / "bf16-cpu-cache"
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(cache))
    real = decided(hardware.probe("cpu", use_cache=False, layers=False))
    path = hardware.cache_path(real)
    path.parent.mkdir(parents=True, exist_ok=True)
    fp32 = real.dtypes["fp32"].gflops or 100.0
    bf16 = dataclasses.replace(real.dtypes["bf16"], supported=True, gflops=round(2.5 * fp32, 2), ratio=2.5, klass="fast")
    simulated = dataclasses.replace(real, dtypes={**real.dtypes, "bf16": bf16})
    path.write_text(json.dumps(simulated.to_dict(), indent=2))
    assert hardware.probe("cpu").dtypes["bf16"].klass == "fast"
    return simulated
