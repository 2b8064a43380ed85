"""Shared fixtures: every test starts and ends with torch's numeric flags untouched."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings


import machines
from mixprec.device import backends, hardware

pytest_plugins = ["_flops16", "_system_packages", "_library_logs"]  # --flops16 / --flops16-budget: the bf16/fp16 FLOPs of each test; the tests a missing system package skipped; a library deprecation logged for mixprec fails its test

# Property tests draw the same examples on every run: a verdict must not depend on which
# random inputs a run happened to draw (cases found once are kept as explicit examples).
settings.register_profile("mixprec", derandomize=True)
settings.load_profile("mixprec")


#: Folders whose conftest builds session fixtures all their tests use: the real-model tests
#: (the probe measured once, the model packages imported once), the reference pipelines.
_SHARED_SET_UP = ("tests/realmodels/", "tests/pipelines/")

#: Modules whose every test's outcome follows the hardware class (marked ``hardware``: ``make
#: test-hardware`` runs them under every class), beside the tests that carry the mark themselves.
_HARDWARE_MODULES = (
    "tests/test_hardware_classes.py",  # the probe, presets, bench's configurations, the demo's plan per class
    "tests/policy/test_presets.py", "tests/policy/test_layer_islands.py",
    "tests/casting/test_explain.py",
    "tests/calibration/test_candidates.py", "tests/calibration/test_decide.py", "tests/calibration/test_calibrate.py",
    "tests/bench/test_configs.py", "tests/bench/test_plan.py", "tests/bench/test_headline.py",
)

#: The terminal variables a worker process must see as the suite's own process saw them.
_TERMINAL_VARIABLES = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist, in the suite's own process: hand each worker this process's terminal variables."""
    node.workerinput["terminal_variables"] = {name: os.environ.get(name) for name in _TERMINAL_VARIABLES}


def pytest_configure(config):
    """In a pytest-xdist worker, the terminal variables as the suite's own process has them.

    GNU readline, loaded in the suite's own process, writes ``COLUMNS=80`` and ``LINES=24``
    into its C environment (``os.environ`` there does not show them), and the workers it
    starts inherit them: the CLI would take them for a terminal's width and wrap its tables
    where a serial run does not.
    """
    worker = getattr(config, "workerinput", None)
    if worker is None:
        return
    for name, value in worker.get("terminal_variables", {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    # The cores shared out between the workers: torch's own threads in every worker
    # (as many as the machine has cores) would make them wait on one another.
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(worker.get("workercount", 1))))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The units pytest-xdist hands out whole (``--dist loadgroup``, as ``make test`` runs it).

    A test keeps the group it names (``xdist_group``: the Ray cluster's tests); the tests of a
    folder in :data:`_SHARED_SET_UP` form one group (its conftest's session fixtures built
    once); every other module is its own group, so its module fixtures are built once.
    """
    for item in items:
        if item.nodeid.split("::", 1)[0] in _HARDWARE_MODULES:
            item.add_marker(pytest.mark.hardware)
        if item.get_closest_marker("xdist_group") is None:
            module = item.nodeid.split("::", 1)[0]
            folder = next((f for f in _SHARED_SET_UP if module.startswith(f)), None)
            item.add_marker(pytest.mark.xdist_group(folder or module))


@pytest.fixture(autouse=True)
def _isolate_torch_flags():
    before = backends.snapshot()
    yield
    backends.restore(before)


def pytest_addoption(parser):
    parser.addoption("--hardware-class", default=None, choices=list(machines.CLASSES),
                     help=f"the machine every test sees (default: ${machines.VARIABLE}, else {machines.DEFAULT})")


def hardware_class(config) -> str:
    """The class this run simulates: ``--hardware-class``, else ``MIXPREC_TEST_HARDWARE``, else the default."""
    chosen = config.getoption("--hardware-class")
    if chosen:
        return chosen
    return machines.check_name(os.environ.get(machines.VARIABLE) or machines.DEFAULT, machines.VARIABLE)


def pytest_report_header(config):
    return f"hardware class: {hardware_class(config)} (scripted; tests marked real_probe see this machine)"


@pytest.fixture(scope="session")
def _probe_files(tmp_path_factory, pytestconfig):
    """Per class, a probe file describing it (written once per session and worker)."""
    folder = tmp_path_factory.mktemp("machines")
    return {name: machines.write(folder / f"{name}.json", descriptions) for name, (_, descriptions) in machines.CLASSES.items()}


@pytest.fixture(scope="session", autouse=True)
def _session_machine(_probe_files, pytestconfig):
    """The run's class for the whole session, so fixtures built once per module or session see
    it too (a module fixture that probes runs before any test's own fixtures)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(hardware.PROBE_FILE_VAR, str(_probe_files[hardware_class(pytestconfig)]))
        yield


@pytest.fixture(autouse=True)
def machine(request, monkeypatch, _probe_files):
    """The machine this test sees: the run's hardware class, scripted through ``MIXPREC_PROBE_FILE``.

    Every probe (in this process and in the processes it starts) reads that description
    instead of measuring, so no outcome depends on the CPU the suite runs on. Returns the
    class's :class:`~mixprec.device.hardware.Hardware` (for ``cuda``: the simulated GPU,
    to hand to the decisions a test makes). A test marked ``real_probe`` sees this machine
    as it is and gets ``None``.
    """
    if request.node.get_closest_marker("real_probe") is not None:
        monkeypatch.delenv(hardware.PROBE_FILE_VAR, raising=False)
        return None
    name = hardware_class(request.config)
    monkeypatch.setenv(hardware.PROBE_FILE_VAR, str(_probe_files[name]))
    return machines.CLASSES[name][0]


@pytest.fixture(scope="session", autouse=True)
def _session_compile_cache(tmp_path_factory):
    """torch.compile's caches (inductor's kernels, FX graphs) in a folder of this session's, shared
    by its workers and the processes they start, never the machine's ``/tmp/torchinductor_$USER``:
    what a test compiles does not depend on what other runs on the machine left there (a cache
    left by earlier runs once made a compiled tts decode abort with ``free(): invalid pointer``
    where a fresh cache compiled and ran it cleanly)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(shared / "torchinductor"))
        yield


@pytest.fixture(autouse=True)
def _isolate_cache(tmp_path_factory, monkeypatch):
    # Probe results go to a per-session cache so tests never touch the user's cache; the
    # workers of one pytest-xdist session share it (their base folders are siblings), so
    # the machine is probed once, not once per worker.
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(shared / "mixprec-cache"))


@pytest.fixture
def clean_env(monkeypatch):
    """An environment without MIXPREC_* or test-app variables (the test cache and the run's scripted machine stay)."""
    import os

    kept = ("MIXPREC_CACHE_DIR", hardware.PROBE_FILE_VAR)
    for name in list(os.environ):
        if name.startswith(("MIXPREC_", "MYAPP_", "ACE_STEP_")) and name not in kept:
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture
def bf16_cpu(_probe_files, monkeypatch):
    """A CPU whose probe measured bf16 fast and fp16 emulated (AVX512-BF16), whatever the run's class.

    For tests of what a preset does with 16-bit types on such a machine: every later
    ``probe()`` (benchmark workers included, through ``MIXPREC_PROBE_FILE``) reads it.
    """
    monkeypatch.setenv(hardware.PROBE_FILE_VAR, str(_probe_files["avx512-bf16"]))
    assert hardware.probe("cpu").dtypes["bf16"].klass == "fast"
    return machines.AVX512_BF16
