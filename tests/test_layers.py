"""The package layout is the architecture: the import-linter contracts in pyproject.toml
hold, and each of them fails when someone adds the kind of import it forbids."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "mixprec"
#: A module past this many lines is usually two ideas (docs/architecture.md).
MAX_LINES = 550


def lint_imports(src: Path = ROOT / "src") -> subprocess.CompletedProcess:
    """Run import-linter on the package found under ``src``, with the project's contracts."""
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True, no_logo=True))")
    env = dict(os.environ, PYTHONPATH=str(src))
    return subprocess.run([sys.executable, "-c", code, str(ROOT / "pyproject.toml")], capture_output=True, text=True,
                          env=env, cwd=src)


def test_the_layer_contracts_hold():
    result = lint_imports()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 3 kept, 0 broken." in result.stdout


@pytest.mark.parametrize("module, line, broken", [
    # casting sits below the benchmark: an applied model must not reach up into it
    ("casting/upcast.py", "from mixprec.bench.store import Store", "mixprec.casting is not allowed to import mixprec.bench"),
    # the tuner and the benchmark are siblings: both measure through mixprec.measure
    ("tuning/bounds.py", "import mixprec.bench.gate", "mixprec.tuning is not allowed to import mixprec.bench"),
    # the device layer knows nothing of policies
    ("device/settings.py", "from mixprec.policy.rules import Policy", "mixprec.device is not allowed to import mixprec.policy"),
    # a lazy import inside a function counts too
    ("measure/metrics.py", "def _late():\n    from mixprec.ui import i18n\n", "mixprec.measure is not allowed to import mixprec.ui"),
    # reference pipelines are plain model code
    ("pipelines/_base.py", "from mixprec.policy import Rule", "mixprec.pipelines is not allowed to import mixprec.policy"),
    # inside one package, two modules importing each other form a circle
    ("policy/roles.py", "def _late():\n    from mixprec.policy import select\n", "No cycles are allowed in mixprec.policy"),
])
def test_a_forbidden_import_breaks_the_contract_and_is_named(tmp_path, module, line, broken):
    copy = tmp_path / "src" / "mixprec"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    if not target.exists():  # the example module moved: any module of that package will do
        target = sorted(target.parent.glob("[!_]*.py"))[0]
    target.write_text(target.read_text() + "\n" + line + "\n")
    result = lint_imports(tmp_path / "src")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout and broken in result.stdout, result.stdout


def test_no_module_is_past_the_size_of_one_idea():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these modules (one idea per file): {long}"
