"""The suite fails on a DeprecationWarning, FutureWarning or ResourceWarning attributed to mixprec's own code.

pyproject.toml's ``filterwarnings`` turns such a warning into an error where it is raised.
Here pytest runs, in a fresh process, a generated test file under exactly those filters:
a module of the ``mixprec`` package that calls a library's deprecated function (the library
warns with ``stacklevel=2``, naming mixprec's frame) or warns itself fails its test; a library
warning about its own internals, a mixprec UserWarning and a deprecation a test expects
(``pytest.warns``) do not.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parents[1]

#: A library: one deprecated function, and internals that use a deprecated helper of its own.
LIBRARY = '''
import warnings


def old_api():
    warnings.warn("old_api is deprecated; use new_api", DeprecationWarning, stacklevel=2)


def run():
    return _legacy_helper()


def _legacy_helper():
    warnings.warn("_legacy_helper is deprecated (the library's own internals)", FutureWarning, stacklevel=2)
'''

#: Code of a mixprec module: it calls the library, and warns itself.
MIXPREC_CODE = '''
import warnings

import library


def calls_the_deprecated_api():
    library.old_api()


def warns_itself():
    warnings.warn("this option of mixprec is deprecated", FutureWarning)


def runs_the_library():
    library.run()


def warns_the_user():
    warnings.warn("a plain mixprec warning", UserWarning)


def leaves_a_file_open():
    for line in open(__file__):  # closed by the garbage collector, in this frame: a ResourceWarning
        pass


def closes_its_file():
    with open(__file__) as fh:
        return fh.read()
'''

TESTS = '''
import importlib.util
from pathlib import Path

import pytest

# Loaded as a module of the mixprec package: warnings name it as "mixprec.generated_calls".
_spec = importlib.util.spec_from_file_location("mixprec.generated_calls", Path(__file__).with_name("calls.py"))
calls = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(calls)


def test_mixprec_calls_a_deprecated_api():
    calls.calls_the_deprecated_api()


def test_mixprec_warns_a_deprecation_itself():
    calls.warns_itself()


def test_a_library_warns_about_its_own_internals():
    calls.runs_the_library()


def test_a_mixprec_user_warning():
    calls.warns_the_user()


def test_a_deprecation_the_test_expects():
    with pytest.warns(DeprecationWarning, match="old_api"):
        calls.calls_the_deprecated_api()


def test_mixprec_leaves_a_file_open():
    calls.leaves_a_file_open()


def test_mixprec_closes_its_file():
    calls.closes_its_file()
'''


def _project_filters() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["pytest"]["ini_options"]["filterwarnings"]


def _run_pytest(folder: Path, filters: list[str]) -> subprocess.CompletedProcess:
    (folder / "pyproject.toml").write_text(tomli_w.dumps({"tool": {"pytest": {"ini_options": {"filterwarnings": filters}}}}))
    (folder / "library.py").write_text(LIBRARY)
    (folder / "calls.py").write_text(MIXPREC_CODE)
    (folder / "test_generated.py").write_text(textwrap.dedent(TESTS))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "PYTEST_ADDOPTS")}
    env.update(PYTHONPATH=str(folder), COLUMNS="400")  # the short summary's lines whole
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-p", "no:randomly", "test_generated.py"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=120)


def test_the_project_filters_fail_deprecations_attributed_to_mixprec_and_only_those(tmp_path):
    filters = _project_filters()
    assert filters, "pyproject.toml sets no filterwarnings"
    done = _run_pytest(tmp_path, filters)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "FAILED test_generated.py::test_mixprec_calls_a_deprecated_api - DeprecationWarning: old_api is deprecated" in output
    assert "FAILED test_generated.py::test_mixprec_warns_a_deprecation_itself - FutureWarning: this option" in output
    assert "FAILED test_generated.py::test_mixprec_leaves_a_file_open - pytest.PytestUnraisableExceptionWarning" in output
    assert "ResourceWarning: unclosed file" in output
    for kept in ("test_a_library_warns_about_its_own_internals", "test_a_mixprec_user_warning",
                 "test_a_deprecation_the_test_expects", "test_mixprec_closes_its_file"):
        assert f"PASSED test_generated.py::{kept}" in output, output
    # The library's warning about itself is still shown, as a warning.
    assert "library.py" in output and "_legacy_helper is deprecated" in output
    assert "3 failed, 4 passed" in output, output


def test_without_the_filters_every_generated_test_passes(tmp_path):
    """The same file under no filter: the failures above are the filters' doing."""
    done = _run_pytest(tmp_path, [])
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "7 passed" in output, output
