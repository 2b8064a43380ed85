"""benchmarks/README.md accounts for every benchmark script and every result file.

Every script (``benchmarks/*.py`` but the private ``_*.py`` helpers) has a row; every result
file in ``benchmarks/results/`` is named, and every one named exists; every script named
exists, or is listed as retired; and each script's ``--help`` runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
README = BENCH / "README.md"

SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))
RESULT = re.compile(r"results/([A-Za-z0-9_.+-]+\.(?:md|txt))\b")
#: A script named bare or as ``benchmarks/<name>``; the lookbehind leaves out other folders' files.
SCRIPT = re.compile(r"(?<![\w/.-])(?:benchmarks/)?(_?[a-z][a-z0-9_]*\.py)\b")


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _sections(text: str) -> tuple[str, str]:
    """(the README before its "Retired" section, that section)."""
    head, sep, retired = text.partition("\n## Retired")
    assert sep, "benchmarks/README.md has no '## Retired' section"
    return head, retired


def _first_cells(text: str) -> set[str]:
    """The script names that open a table row (``| `bench_x.py` ... |``)."""
    return set(re.findall(r"^\| `([\w.]+\.py)`", text, flags=re.M))


def test_every_script_has_a_row():
    head, _ = _sections(_text())
    missing = sorted(set(SCRIPTS) - _first_cells(head))
    assert not missing, f"benchmarks/README.md has no row for {missing}"


def test_every_result_file_is_named_and_every_named_one_exists():
    named = set(RESULT.findall(_text()))
    present = {p.name for p in (BENCH / "results").iterdir() if p.is_file()}
    assert not sorted(present - named), f"result files the README does not name: {sorted(present - named)}"
    assert not sorted(named - present), f"result files the README names that do not exist: {sorted(named - present)}"


def test_every_script_named_exists_or_is_retired():
    head, retired = _sections(_text())
    gone = _first_cells(retired)
    assert gone, "the Retired section lists no script"
    assert not sorted(gone & set(SCRIPTS)), "a script listed as retired is still in benchmarks/"
    for name in set(SCRIPT.findall(head)):  # a path's last part (examples/x.py, tests/x.py) is not matched
        assert (BENCH / name).is_file(), f"benchmarks/README.md names {name}, which is not in benchmarks/"
    for name in gone:
        assert name not in head, f"{name} is retired but still named above the Retired section"


def test_commands_run_from_the_repository_root():
    head, _ = _sections(_text())
    for name in SCRIPTS:
        assert f".venv/bin/python benchmarks/{name}" in head, f"no runnable command for {name}"


#: Runs each script as ``__main__`` with ``--help``, its folder first on ``sys.path`` as for
#: ``python benchmarks/<script>``, in one interpreter (torch is imported once: about 2 s in all,
#: where a process per script takes 1-2 s each); prints {script: [exit status, whether it printed a usage, output's tail]}.
_HELP_ALL = """
import contextlib, io, json, runpy, sys
bench, names = sys.argv[1], sys.argv[2:]
sys.path.insert(0, bench)
found = {}
for name in names:
    sys.argv, buf, code = [bench + "/" + name, "--help"], io.StringIO(), 0
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) or exc.code is None else 1
        except BaseException as exc:
            code, _ = 1, buf.write(repr(exc))
    found[name] = [code or 0, "usage:" in buf.getvalue(), buf.getvalue()[-400:]]
print(json.dumps(found))
"""


def test_every_script_answers_help():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", _HELP_ALL, str(BENCH), *SCRIPTS], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(found) == SCRIPTS
    failed = {name: out for name, (code, usage, out) in found.items() if code != 0 or not usage}
    assert not failed, failed
