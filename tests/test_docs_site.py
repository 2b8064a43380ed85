"""The documentation site builds in strict mode, and with no warning at all.

``mkdocs build --strict`` (as ``make docs`` runs it) already fails on a broken link, a missing
anchor or a docstring mkdocstrings cannot read; this test also fails on any WARNING line it
prints. The site goes to a temporary folder, never to ``site/``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed (the docs extra)")
def test_the_site_builds_strictly_without_warnings(tmp_path):
    # Material prints an upstream notice about its future on every build; the variable silences only that.
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    warnings = [line for line in output.splitlines() if line.lstrip().upper().startswith("WARNING")]
    assert not warnings, "\n".join(warnings)
    assert (tmp_path / "site" / "index.html").exists() and (tmp_path / "site" / "api" / "apply" / "index.html").exists()
