"""pytest plugin: what each test costs, counted in units no machine's speed changes, and a budget for it.

A CPU without native 16-bit arithmetic (AVX2 only) runs bf16 and fp16 matrix products at
about 1.3 GFLOP/s, 1/60 of its fp32 rate; there, those FLOPs are what the suite costs first.
This plugin counts them per test (``_flops16_site/flops16_count.py``: torch's flop
formulas, applied where an operator's inputs are bf16, fp16 or fp32, with the kernels that
run without the counter), and beside them what costs time on any CPU: the fp32 FLOPs, the
pipelines built (``mixprec.pipelines.get``'s audit event) and the Python processes started.
Each is the same on every machine, unlike a time.

Enable it with either (the environment variables do what the options do)::

    --flops16=PATH           MIXPREC_TEST_FLOPS16=PATH          write the JSON report to PATH
    --flops16-budget=PATH    MIXPREC_TEST_FLOPS16_BUDGET=PATH   fail what exceeds the budget in PATH

    --flops16-select=PATH                                       run only the tests that computed in
                                                                16-bit in the report at PATH

The report holds every test's ``bf16``, ``fp16`` and ``fp32`` FLOPs, its ``builds`` and
``processes`` (``subprocesses``: the part of them in the Python subprocesses it started),
the ``total``, and the FLOPs per operator. The budget file (``tests/flops16_budget.json``,
see ``_flops16_site/flops16_budget.py``) holds a per-test ceiling of 16-bit FLOPs (a test
above it errors at teardown) and totals (a session above one fails); tests carrying one of
its ``unbudgeted_markers`` are reported but not budgeted.
A test marked ``flops16_off(reason)`` runs without the counter (nothing of it is counted).

What is counted: the test's own thread from the start of its set-up to the end of its
teardown (a session fixture's work goes to the first test that needs it); every thread
started while counting is on, its work going to the test running at that moment; and
every Python subprocess started during a test that inherits the environment (the
plugin puts ``_flops16_site`` on ``PYTHONPATH``: see its ``sitecustomize``), its work
going to the test that started it. Not counted: subprocesses given an environment of
their own without ``PYTHONPATH``, processes forked without exec, and ops inside kernels
that ``torch.compile`` fused (its calls to aten matrix products are counted).

Under pytest-xdist each worker counts its own tests and hands its part to the suite's
own process (``workeroutput``), which writes the report and applies the total budget.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

from _flops16_site.flops16_budget import NAMES, Budget, flops, gflop, load_budget, over_budget, over_ceiling, summarize
from _flops16_site.flops16_count import Flops16Mode

#: The folder a subprocess finds ``sitecustomize`` in.
SITE = Path(__file__).parent / "_flops16_site"
#: The environment variables that stand for the options.
ENV_REPORT, ENV_BUDGET = "MIXPREC_TEST_FLOPS16", "MIXPREC_TEST_FLOPS16_BUDGET"
#: Where a subprocess started by the running test writes its counts (``<prefix>-<pid>.cnt``).
ENV_SUBPROCESS = "FLOPS16_COUNT_TO"
#: The tests' work done with no test running (a thread still busy after its test ended).
OUTSIDE = "(outside any test)"
#: The marker that runs a test without the counter.
OFF = "flops16_off"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("flops16", "16-bit FLOPs per test (tests/_flops16.py)")
    group.addoption("--flops16", metavar="PATH", default=None,
                    help=f"count each test's bf16/fp16 FLOPs and write them to PATH as JSON (or set {ENV_REPORT})")
    group.addoption("--flops16-budget", metavar="PATH", default=None,
                    help=f"count each test's bf16/fp16 FLOPs and fail a test or the session above the budget in PATH "
                         f"(or set {ENV_BUDGET})")
    group.addoption("--flops16-select", metavar="PATH", default=None,
                    help="run only the tests that computed in bf16/fp16 in the report at PATH (written by --flops16): "
                         "make test-avx2 runs them again under AVX2's kernels")


def sixteen_bit_tests(path: str | Path) -> set[str]:
    """The node ids of the tests that computed in bf16 or fp16 in the report at ``path``.

    Raises:
        pytest.UsageError: the file is not such a report (named, with what it must hold).
    """
    try:
        tests = json.loads(Path(path).read_text(encoding="utf-8"))["tests"]
        return {nodeid for nodeid, counts in tests.items() if flops(counts) > 0}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise pytest.UsageError(f"--flops16-select: {path} is not a report of --flops16 (JSON whose 'tests' maps each "
                                f"node id to its counts) ({type(exc).__name__}: {exc})") from None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--flops16-select``: keep the tests that computed in 16-bit in that report, deselect the rest."""
    path = config.getoption("flops16_select")
    if not path:
        return
    chosen = sixteen_bit_tests(Path(config.invocation_params.dir, path))
    kept = [item for item in items if item.nodeid in chosen]
    dropped = [item for item in items if item.nodeid not in chosen]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def _setting(config: pytest.Config, option: str, env: str) -> str | None:
    value = config.getoption(option) or os.environ.get(env) or None
    return None if value is None else str(Path(config.invocation_params.dir, value))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{OFF}(reason): run this test without the 16-bit FLOP counter "
                                       "(tests/_flops16.py), saying why")
    worker = getattr(config, "workerinput", None)
    settings = worker.get("flops16") if worker is not None else {
        "report": _setting(config, "flops16", ENV_REPORT), "budget": _setting(config, "flops16_budget", ENV_BUDGET)}
    if not settings or not (settings["report"] or settings["budget"]):
        return
    try:
        budget = load_budget(settings["budget"]) if settings["budget"] else None
    except ValueError as exc:
        raise pytest.UsageError(f"--flops16-budget: {exc}") from None
    # pytest-xdist's own process runs no test (xdist's rule: it registers its session after this hook)
    controller = (worker is None and config.getoption("dist", "no") != "no" and bool(config.getoption("tx", None))
                  and not config.getoption("collectonly"))
    plugin = _Controller(settings, budget) if controller else _Counter(config, settings, budget)
    config.pluginmanager.register(plugin, "flops16-counter")


class _Tally:
    """FLOPs per test, added to from any thread; ``current`` is the test running."""

    def __init__(self) -> None:
        self.tests: dict[str, dict[str, int]] = {}
        self.current = OUTSIDE
        self._lock = threading.Lock()

    def add(self, name: str, flops: int) -> None:
        with self._lock:
            counts = self.tests.setdefault(self.current, dict.fromkeys(NAMES, 0))
            counts[name] += flops


def _read_subprocess_counts(paths: list[Path]) -> dict[str, int]:
    """What the subprocesses that wrote ``paths`` counted (one file each: one process started)."""
    out = dict.fromkeys(NAMES, 0)
    for path in paths:
        for name, value in zip(FILE_COUNTS, path.read_text().split()):
            out[name] += int(value)
        out["processes"] += 1
    return out


#: The audit event raised for every pipeline built (``mixprec.pipelines.get``).
BUILD_EVENT = "mixprec.pipelines.build"
#: The counts a subprocess's file holds, in order (``_flops16_site/sitecustomize.py`` writes them).
FILE_COUNTS = ("bf16", "fp16", "fp32", "builds")
#: The tally the process's audit hook adds builds to (an audit hook cannot be removed: one per process).
_BUILDS_TO: list[_Tally] = []


def _count_builds(event: str, args: tuple) -> None:
    if event == BUILD_EVENT and _BUILDS_TO:
        _BUILDS_TO[-1].add("builds", 1)


class _Counter:
    """Counts the tests this process runs (the whole suite, or one pytest-xdist worker's share)."""

    def __init__(self, config: pytest.Config, settings: dict[str, Any], budget: Budget | None) -> None:
        self.config, self.settings, self.budget = config, settings, budget
        self.tally = _Tally()
        self.modes: list[Flops16Mode] = []
        self.order: dict[str, str] = {}  # subprocess file prefix -> nodeid
        self.prefixes: dict[str, list[str]] = {}  # nodeid -> its subprocess file prefixes
        self.seconds: dict[str, float] = {}
        self.flags: dict[str, dict[str, str]] = {}  # nodeid -> {"unbudgeted"/"not_counted": why}
        self.folder = Path(tempfile.mkdtemp(prefix="mixprec-flops16-"))
        self._saved_env = {name: os.environ.get(name) for name in ("PYTHONPATH", ENV_SUBPROCESS)}
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH")) if p)
        self._saved_profile = threading.getprofile()
        threading.setprofile(self._count_new_thread)
        self.report: dict[str, Any] | None = None
        self.failure: str | None = None
        if not _BUILDS_TO:
            sys.addaudithook(_count_builds)
        _BUILDS_TO.append(self.tally)

    def _count_new_thread(self, frame, event, arg):
        """Every thread started from now on: its work counts to the test running when it computes."""
        sys.setprofile(self._saved_profile)
        mode = Flops16Mode(on_count=self.tally.add)
        self.modes.append(mode)
        from torch.utils._python_dispatch import _push_mode

        _push_mode(mode)  # for the thread's life (it never returns here to pop it)

    def _flag(self, item: pytest.Item) -> dict[str, str]:
        off = item.get_closest_marker(OFF)
        if off is not None:
            return {"not_counted": str(off.args[0] if off.args else off.kwargs.get("reason", ""))}
        for marker, why in (self.budget or {}).get("unbudgeted_markers", {}).items():
            if item.get_closest_marker(marker) is not None:
                return {"unbudgeted": f"marked {marker}: {why}"}
        return {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        flag = self.flags[item.nodeid] = self._flag(item)
        if "not_counted" in flag:
            yield
            return
        prefix = self.folder / f"{len(self.order):06d}"
        self.order[prefix.name] = item.nodeid
        self.prefixes.setdefault(item.nodeid, []).append(prefix.name)
        os.environ[ENV_SUBPROCESS] = str(prefix)
        self.tally.current = item.nodeid
        mode = Flops16Mode(on_count=self.tally.add)
        self.modes.append(mode)
        try:
            with mode:
                yield
        finally:
            self.tally.current = OUTSIDE
            os.environ.pop(ENV_SUBPROCESS, None)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report = outcome.get_result()
        self.seconds[item.nodeid] = self.seconds.get(item.nodeid, 0.0) + report.duration
        if call.when != "teardown" or self.budget is None or not report.passed or self.flags.get(item.nodeid):
            return
        failure = over_ceiling(item.nodeid, self._counts_of(item.nodeid), self.budget, self.settings["budget"])
        if failure is not None:
            report.outcome = "failed"
            report.longrepr = failure

    def _counts_of(self, nodeid: str) -> dict[str, int]:
        own = self.tally.tests.get(nodeid, {})
        sub = _read_subprocess_counts([f for p in self.prefixes.get(nodeid, []) for f in self.folder.glob(f"{p}-*.cnt")])
        return {name: own.get(name, 0) + sub[name] for name in NAMES}

    def _tests(self) -> dict[str, dict[str, Any]]:
        tests: dict[str, dict[str, Any]] = {}
        for nodeid in dict.fromkeys([*self.flags, *self.tally.tests]):
            own = self.tally.tests.get(nodeid, {})
            tests[nodeid] = {**{name: own.get(name, 0) for name in NAMES}, **self.flags.get(nodeid, {})}
            if nodeid in self.seconds:
                tests[nodeid]["seconds"] = round(self.seconds[nodeid], 3)
        for path in sorted(self.folder.glob("*.cnt")):  # read last: a subprocess may outlive its test
            test = tests[self.order[path.name.split("-", 1)[0]]]
            sub = _read_subprocess_counts([path])
            part = test.setdefault("subprocesses", dict.fromkeys(NAMES, 0))
            for name in NAMES:
                part[name] += sub[name]
                test[name] += sub[name]
        return tests

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        by_op: dict[str, int] = {}
        uncounted: dict[str, int] = {}
        for mode in self.modes:
            for totals, more in ((by_op, mode.by_op), (uncounted, mode.uncounted)):
                for op, value in more.items():
                    totals[op] = totals.get(op, 0) + value
        part = {"tests": self._tests(), "by_op": by_op, "uncounted": uncounted}
        worker = getattr(self.config, "workerinput", None)
        if worker is not None:
            self.config.workeroutput["flops16"] = json.dumps(part)
            return
        self.report = summarize(**part)
        self.failure = _finish(self.report, self.settings, self.budget, session)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.report is not None:
            _summary(terminalreporter, self.report, self.settings, self.failure)

    def pytest_unconfigure(self) -> None:
        _BUILDS_TO.remove(self.tally)
        threading.setprofile(self._saved_profile)
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for path in self.folder.glob("*.cnt"):
            path.unlink()
        self.folder.rmdir()


class _Controller:
    """pytest-xdist's own process: merges the workers' parts, writes the report, applies the total budget."""

    def __init__(self, settings: dict[str, Any], budget: Budget | None) -> None:
        self.settings, self.budget = settings, budget
        self.part: dict[str, dict[str, Any]] = {"tests": {}, "by_op": {}, "uncounted": {}}
        self.report: dict[str, Any] | None = None
        self.failure: str | None = None

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput["flops16"] = self.settings

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        part = getattr(node, "workeroutput", {}).get("flops16")
        if part is None:  # a worker that crashed: its tests are run again by another, counted there
            return
        part = json.loads(part)
        self.part["tests"].update(part["tests"])
        for key in ("by_op", "uncounted"):
            for op, value in part[key].items():
                self.part[key][op] = self.part[key].get(op, 0) + value

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.report = summarize(**self.part)
        self.failure = _finish(self.report, self.settings, self.budget, session)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.report is not None:
            _summary(terminalreporter, self.report, self.settings, self.failure)


def _finish(report: dict[str, Any], settings: dict[str, Any], budget: Budget | None,
            session: pytest.Session) -> str | None:
    """Write the report where asked; fail the session above the total budget (the reason, or ``None``)."""
    if settings["report"]:
        path = Path(settings["report"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    failure = over_budget(report, budget, settings["budget"]) if budget is not None else None
    if failure is not None and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return failure


def _summary(terminalreporter, report: dict[str, Any], settings: dict[str, Any], failure: str | None) -> None:
    total = report["total"]
    where = f"; report: {settings['report']}" if settings["report"] else ""
    budget = f"; budget: {settings['budget']}" if settings["budget"] else ""
    terminalreporter.write_sep("-", "what the tests cost (tests/_flops16.py)")
    terminalreporter.write_line(f"bf16 {gflop(total['bf16'])}, fp16 {gflop(total['fp16'])}, budgeted "
                                f"{gflop(total['budgeted'])}, in {len(report['tests'])} tests{budget}{where}")
    terminalreporter.write_line(f"fp32 {gflop(total['fp32'])}, {total['builds']:,} pipelines built, "
                                f"{total['processes']:,} Python processes started")
    if report["uncounted"]:
        terminalreporter.write_line(f"not counted (no formula for these arguments): {report['uncounted']}")
    if failure is not None:
        terminalreporter.write_line(f"FAILED: {failure}", red=True, bold=True)
