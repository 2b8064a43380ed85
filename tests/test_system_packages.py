"""The run's closing line on tests skipped for a missing system package (tests/_system_packages.py).

pytest runs generated test files in a fresh process with the plugin loaded as tests/conftest.py
loads it, one process and with pytest-xdist's workers (as ``make test`` runs the suite); and
the browser tests' own skip reason is the one the plugin counts.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _system_packages import SYSTEM_PACKAGES, summary_lines

TESTS = Path(__file__).resolve().parent
CHROMIUM_LINE = ("3 tests skipped because Chromium is not installed; "
                 "install it with: apt-get install -y chromium chromium-driver")

BROWSER_TESTS = '''
import pytest

CHROMIUM = "/nonexistent/chromium"


@pytest.fixture
def browser():
    pytest.skip(f"no Chromium at {CHROMIUM}")


@pytest.mark.parametrize("page", ["run", "bench", "tune"])
def test_a_page(browser, page):
    pass


def test_without_the_browser():
    pass


def test_skipped_for_another_reason():
    pytest.skip("the playwright package is not installed")
'''

NO_BROWSER_TESTS = '''
import pytest


def test_runs():
    pass


def test_skipped_for_another_reason():
    pytest.skip("the playwright package is not installed")
'''


def _run(folder: Path, tests: str, *options: str) -> list[str]:
    (folder / "conftest.py").write_text('pytest_plugins = ["_system_packages"]\n')
    (folder / "test_generated.py").write_text(tests)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env.update(PYTHONPATH=str(TESTS), COLUMNS="400")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", *options, "test_generated.py"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("options", [("-p", "no:xdist"), ("-n", "2", "--dist", "loadgroup")], ids=["serial", "xdist"])
def test_the_run_ends_with_the_count_and_the_install_command(tmp_path, options):
    lines = _run(tmp_path, BROWSER_TESTS, *options)
    assert lines[-2] == CHROMIUM_LINE, "\n".join(lines)  # just above pytest's own count
    assert "1 passed, 4 skipped" in lines[-1]
    assert sum("apt-get" in line for line in lines) == 1


def test_nothing_is_printed_where_no_test_skipped_for_a_system_package(tmp_path):
    lines = _run(tmp_path, NO_BROWSER_TESTS, "-p", "no:xdist")
    assert "1 passed, 1 skipped" in lines[-1]
    assert not any("not installed;" in line or "apt-get" in line for line in lines), "\n".join(lines)


def test_one_skipped_test_reads_in_the_singular():
    assert list(summary_lines({"Chromium": 1})) == [
        "1 test skipped because Chromium is not installed; install it with: apt-get install -y chromium chromium-driver"]
    assert list(summary_lines({})) == []


def _skip_reasons(path: Path) -> list[str]:
    """The constant start of every ``pytest.skip(...)`` reason in a test module."""
    starts = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "skip"
                and node.args):
            arg = node.args[0]
            if isinstance(arg, ast.JoinedStr):
                arg = arg.values[0] if arg.values else arg
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                starts.append(arg.value)
    return starts


def test_the_browser_tests_skip_with_the_reason_the_plugin_counts():
    prefix, _ = SYSTEM_PACKAGES["Chromium"]
    reasons = _skip_reasons(TESTS / "ui" / "test_ui_browser.py")
    assert any(reason.startswith(prefix) for reason in reasons), reasons
