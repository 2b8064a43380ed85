"""Real-architecture suite: tiny, seeded transformers / diffusers models under every policy.

* ``heavy``: combinations left out of the default run (the slowest ones, and those
  that repeat another combination); ``MIXPREC_HEAVY=1`` runs them.
* ``hw``: the hardware a preset is resolved against, "measured" (the CPU of the run's
  hardware class) or "bf16-fast" (a CPU whose probe measured bf16 fast).
* A summary of every combination's metrics is printed at the end of the run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


#: The Chatterbox TTS example's factory (examples/chatterbox_tts.py).
CHATTERBOX_SPEC = f"{Path(__file__).resolve().parents[2] / 'examples' / 'chatterbox_tts.py'}:pipeline"


@pytest.fixture(scope="session")
def chatterbox_pipeline():
    """The Chatterbox example's test-size pipeline (the real chatterbox-tts classes, seed 0), built once a session.

    Building it is the costly part (S3Gen alone has 264M weights to initialise): test_chatterbox_example.py
    runs it as built, test_chatterbox_policies.py a copy with shorter runs over the same modules. Every
    policy combination asserts that its revert left every weight bit-exact, so a module that runs after
    another sees the weights as built.
    """
    pytest.importorskip("chatterbox.models.t3", reason="chatterbox-tts is not installed")
    import torch

    from mixprec import pipelines

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a loaded 2-core machine: OpenMP threads would contend
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.delenv("CHATTERBOX_CKPT_DIR", raising=False)
            mp.delenv("CHATTERBOX_VOICE", raising=False)
            return pipelines.get(CHATTERBOX_SPEC, size="test", seed=0)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def measured_hw(machine):
    """The CPU the run's hardware class describes, as every ``probe()`` in the test reads it
    (``tests/conftest.py``: a scripted machine, never this one)."""
    return hardware.probe("cpu")


@pytest.fixture
def bf16_fast_hw(bf16_cpu):
    """A CPU whose probe measured bf16 fast, whatever the run's class (``tests/conftest.py::bf16_cpu``)."""
    return bf16_cpu


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
