"""Real-architecture suite: tiny, seeded transformers / diffusers models under every policy.

* ``heavy``: combinations left out of the default run (the slowest ones, and those
  that repeat another combination); ``MIXPREC_HEAVY=1`` runs them.
* ``hw``: the hardware a preset is resolved against, "measured" (this machine's
  probe) or "bf16-fast" (this machine as a CPU whose probe measured bf16 fast).
* A summary of every combination's metrics is printed at the end of the run.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from probe_helpers import decided

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from mixprec import hardware  # noqa: E402

HEAVY_ENV = "MIXPREC_HEAVY"


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        f"heavy: a slow or repeated real-model combination, skipped unless {HEAVY_ENV}=1",
    )


def pytest_collection_modifyitems(config, items):
    if os.environ.get(HEAVY_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"heavy real-model combination: set {HEAVY_ENV}=1 to run it")
    for item in items:
        if item.get_closest_marker("heavy") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="module", autouse=True)
def _one_intra_op_thread():
    """Run these tiny models on one intra-op thread, restored after each test module.

    Tensors of a few thousand elements gain nothing from a second thread, and on a
    loaded 2-core machine OpenMP threads contend: the SD pipeline took 7 s per run
    with 2 threads under load against 0.2 s with one. The numerics checks compare runs
    made under the same setting, the fp32 reference included.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def _probe_measurement(tmp_path_factory):
    """This machine's real probe, measured once into a private cache: (Hardware, file name).

    Measured on one thread, as the tests run (the cache key includes the thread count).
    """
    import torch

    cache = tmp_path_factory.mktemp("realmodels-probe")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MIXPREC_CACHE_DIR", str(cache))
            real = decided(hardware.probe("cpu", use_cache=False, layers=False))
            path = hardware.cache_path(real)
    finally:
        torch.set_num_threads(threads)
    return real, path.name


@pytest.fixture
def measured_hw(_probe_measurement, tmp_path, monkeypatch):
    """This machine as its probe measured it (every ``probe()`` in the test reads it)."""
    real, name = _probe_measurement
    cache = tmp_path / "measured-cache"
    cache.mkdir()
    (cache / name).write_text(json.dumps(real.to_dict(), indent=2))
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(cache))
    assert hardware.probe("cpu").dtypes == real.dtypes
    return real


@pytest.fixture
def bf16_fast_hw(_probe_measurement, tmp_path, monkeypatch):
    """What ``tests/conftest.py::bf16_cpu`` returns, without re-measuring the probe per test.

    Same construction: the real measurement with its bf16 entry rewritten as fast
    (2.5x fp32), written to a private cache that every later ``probe()`` reads.
    """
    real, name = _probe_measurement
    fp32 = real.dtypes["fp32"].gflops or 100.0
    bf16 = dataclasses.replace(real.dtypes["bf16"], supported=True, gflops=round(2.5 * fp32, 2), ratio=2.5, klass="fast")
    simulated = dataclasses.replace(real, dtypes={**real.dtypes, "bf16": bf16})
    cache = tmp_path / "bf16-fast-cache"
    cache.mkdir()
    (cache / name).write_text(json.dumps(simulated.to_dict(), indent=2))
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(cache))
    assert hardware.probe("cpu").dtypes["bf16"].klass == "fast"
    return simulated


@pytest.fixture
def hw(request):
    """The Hardware for ``request.param`` ("measured" or "bf16-fast")."""
    return request.getfixturevalue({"measured": "measured_hw", "bf16-fast": "bf16_fast_hw"}[request.param])


def pytest_terminal_summary(terminalreporter):
    rows = []
    for key in ("passed", "failed"):
        for report in terminalreporter.stats.get(key, []):
            if report.when != "call" or "realmodels" not in report.nodeid or "selfcheck" in report.nodeid:
                continue
            props = dict(report.user_properties)
            if "metrics" in props:
                rows.append(f"{key.upper():6} {report.nodeid.split('::')[-1]:60} {report.duration:6.2f}s  {props['metrics']}")
    if rows:
        terminalreporter.write_sep("-", "real-model metrics (vs the fp32 run)")
        for row in rows:
            terminalreporter.write_line(row)
