"""The tests skipped because a system package is missing: one line per package at the end of the run.

A test that needs a program pip does not install (Chromium, for the browser tests in
tests/ui/test_ui_browser.py) skips with a reason that starts with that package's prefix in
:data:`SYSTEM_PACKAGES`. The run's summary then ends with how many tests skipped that way and
the command that installs the package, just above pytest's own count; nothing where no test did.
Under pytest-xdist the workers' skip reports come back to the suite's own process as reports
like any other, so the count is the whole run's. tests/conftest.py loads this plugin.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pytest

#: Per system package: the start of the reason its tests skip with, and the command that installs it.
SYSTEM_PACKAGES: dict[str, tuple[str, str]] = {
    "Chromium": ("no Chromium at ", "apt-get install -y chromium chromium-driver"),
}


def skip_reason(report: pytest.TestReport) -> str | None:
    """The reason a skipped test gave (``pytest.skip(reason)``), else ``None``."""
    longrepr = report.longrepr
    if not report.skipped or not isinstance(longrepr, (tuple, list)) or len(longrepr) != 3:
        return None
    return str(longrepr[2]).removeprefix("Skipped: ")


def missing_packages(reports: Iterable[pytest.TestReport]) -> dict[str, int]:
    """Per system package of :data:`SYSTEM_PACKAGES`, how many tests skipped for its absence (each test once)."""
    counted: dict[str, set[str]] = {}
    for report in reports:
        reason = skip_reason(report)
        if reason is None:
            continue
        for package, (prefix, _) in SYSTEM_PACKAGES.items():
            if reason.startswith(prefix):
                counted.setdefault(package, set()).add(report.nodeid)
    return {package: len(tests) for package, tests in counted.items()}


def summary_lines(counts: dict[str, int]) -> Iterator[str]:
    """One line per missing package: the number of tests it left out and the command that installs it."""
    for package, count in counts.items():
        install = SYSTEM_PACKAGES[package][1]
        yield (f"{count} test{'s' if count != 1 else ''} skipped because {package} is not installed; "
               f"install it with: {install}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    """After pytest's own summary (``-ra``'s short one included), before its closing count."""
    try:
        return (yield)
    finally:
        for line in summary_lines(missing_packages(terminalreporter.stats.get("skipped", []))):
            terminalreporter.write_line(line, yellow=True, bold=True)
