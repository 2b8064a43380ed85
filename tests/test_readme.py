"""The shell commands of README.md, examples/README.md and docs/**/*.md run as written.

Every command is extracted from the pages' code blocks (``bash`` blocks, and ``$ ``
lines in untagged ones; tests/docs_blocks.py reads them) and must be classified here: run (quick, no weights, network or
GPU), or skipped with its reason. A new command nobody classified fails the test, so a
page cannot grow a command that was never tried. The quick ones run in a fresh
``bash`` with the environment the README says to activate (``. .venv/bin/activate``),
from a scratch directory that sees the repository's ``examples/`` and ``benchmarks/``.
Synopsis brackets (``[--device cuda]``) are optional parts: the command runs without them.
Python and TOML blocks are checked by tests/test_docs_blocks.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from docs_blocks import READMES, ROOT, blocks, doc_files

ACTIVATE = ". .venv/bin/activate"

#: (pattern, expected exit status): commands that run here.
RUN: list[tuple[str, int]] = [
    (r"^\. \.venv/bin/activate$", 0),
    (r"^mixprec --version$", 0),
    (r"^mixprec presets$", 0),
    (r"^mixprec env --json$", 0),
    (r"^mixprec config show --app ACE_STEP$", 0),
    (r"^MIXPREC_FLOAT32_MATMUL_PRECISION=fastest mixprec config show$", 2),  # the README shows this error
    (r"^mixprec fallbacks list$", 0),
    (r"^mixprec runs list$", 0),
    (r"^mixprec calibrate --list$", 0),
]

#: (pattern, reason): commands left out, each with why.
SKIP: list[tuple[str, str]] = [
    (r"^make (demo|test)\b", "long: installs, then benchmarks or tests for minutes (the README's own set-up)"),
    (r"^make docs$", "builds the site: tests/test_docs_site.py builds it in strict mode"),
    (r"^ray start ", "starts a Ray cluster node"),
    (r"^\.venv/bin/lint-imports$", "reads the repository's contracts from its root; tests/test_layers.py runs the check"),
    (r"^mixprec env$", "measures the hardware again when its cache is cold (the --json form runs)"),
    (r"^mixprec pipelines$", "builds every pipeline size to count its weights (a minute on a loaded 2-core machine)"),
    (r"^mixprec explain ", "builds a pipeline first (tens of seconds on 2 cores); tests/cli covers explain"),
    (r"^mixprec bench ", "long: a benchmark of several configurations"),
    (r"^mixprec calibrate --pipeline ", "times a preset's candidates on a pipeline (seconds to minutes); tests/cli covers it"),
    (r"^mixprec tune ", "long: a measured search"),
    (r"^mixprec diagnose ", "long: profiles every module of a pipeline"),
    (r"^mixprec run ", "runs a whole pipeline (and the examples need downloaded weights)"),
    (r"^mixprec ui\b", "starts a web server"),
    (r"^mixprec env --device cuda --json > ", "records a GPU: needs one (tests/device/test_hardware.py records env --json and reads it back)"),
    (r"^MIXPREC_PROBE_FILE=\S+ mixprec presets --device cuda$",
     "reads the recording the command before it makes on a GPU (tests/device/test_hardware.py runs this on a recorded H100)"),
    (r"^mixprec (runs show|compare|gate) ", "needs benchmark runs stored before"),
    (r"--executor ray|^mixprec compare .* --matrix", "needs a Ray cluster"),
    (r"^CHATTERBOX_VOICE=", "needs downloaded Chatterbox weights"),
    (r"^(python3 -m pip|pip|git clone|hf download|export CHATTERBOX)", "installs or downloads: needs the network"),
    (r"^git worktree add \.\./baseline ", "a CI job's step: checks out another revision beside this repository"),
    (r"^python3 -m venv \.\./baseline/", "a CI job's step: a second environment, installed from the network"),
    (r"^\.\./baseline/\.venv/bin/mixprec bench ", "a CI job's step: long, a benchmark in the baseline's environment"),
    (r"benchmarks/gpu_check\.py", "needs a GPU"),
]


def _commands() -> list[tuple[str, int, str]]:
    """(file, line, command) of every shell command in the pages' code blocks."""
    found = []
    for block in (b for name in doc_files() for b in blocks(name)):
        lang = block.lang
        if lang not in ("", "bash", "sh", "shell", "console"):
            continue
        name, pending, start = block.file, "", 0
        for number, line in enumerate(block.text.splitlines(), start=block.line + 1):
            text = line[2:] if line.startswith("$ ") else (line if lang else ("" if not pending else line))
            if not pending and lang == "" and not line.startswith("$ "):
                continue  # output shown in an untagged block
            text = text.strip()
            if not pending:
                start = number
            if text.endswith("\\"):
                pending += text[:-1] + " "
                continue
            command = _strip_comment(pending + text).strip()
            pending = ""
            if command:
                found.append((name, start, command))
    return found


def _strip_comment(command: str) -> str:
    """The command without a trailing ``# comment`` (outside quotes)."""
    quote = None
    for i, ch in enumerate(command):
        if ch in "\"'" and quote in (None, ch):
            quote = None if quote == ch else ch
        elif ch == "#" and quote is None and (i == 0 or command[i - 1] == " "):
            return command[:i]
    return command


def _runnable(command: str) -> str:
    """The command without its optional synopsis parts (``[--device cuda]``)."""
    return re.sub(r"\s*\[[^\]]*\]", "", command).strip()


COMMANDS = _commands()


def _classify(command: str) -> tuple[str, object]:
    for pattern, status in RUN:
        if re.search(pattern, _runnable(command)):
            return "run", status
    for pattern, reason in SKIP:
        if re.search(pattern, command):
            return "skip", reason
    return "unknown", None


class TestReadmeCommands:
    def test_the_readme_says_how_to_reach_the_tools_and_both_readmes_have_commands(self):
        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        assert ACTIVATE in readme and ".venv/bin/mixprec" in readme
        assert ACTIVATE in (ROOT / "examples/README.md").read_text(encoding="utf-8")
        assert set(READMES) <= {name for name, _, _ in COMMANDS}
        assert any(_classify(c)[0] == "run" for _, _, c in COMMANDS)

    def test_the_extraction_joins_continued_lines_and_drops_comments_and_synopsis_brackets(self):
        assert _strip_comment("mixprec env   # hardware # more") == "mixprec env   "
        assert _strip_comment('mixprec tune --bound "a#b"') == 'mixprec tune --bound "a#b"'
        assert _runnable("mixprec explain --pipeline diffusion --preset memory [--device cuda]") == \
            "mixprec explain --pipeline diffusion --preset memory"
        continued = [c for _, _, c in COMMANDS if c.startswith("mixprec gate 3")]
        assert continued and "--baseline 1" in continued[0] and "\\" not in continued[0]

    @pytest.mark.real_probe  # run as a user runs it, without MIXPREC_* variables: a probe measures this machine
    @pytest.mark.parametrize("name, line, command", COMMANDS, ids=[f"{n}:{line}" for n, line, _ in COMMANDS])
    def test_each_command_runs_as_written_or_is_skipped_for_a_reason(self, tmp_path, tmp_path_factory, name, line, command):
        kind, detail = _classify(command)
        assert kind != "unknown", (f"{name}:{line}: {command!r} is neither run nor skipped here: add it to RUN "
                                   "(quick, no weights/network/GPU) or SKIP with the reason")
        if kind == "skip":
            pytest.skip(f"{name}:{line}: {detail}")
        for folder in ("examples", "benchmarks", ".venv"):
            (tmp_path / folder).symlink_to(ROOT / folder)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MIXPREC_", "ACE_STEP_"))}
        venv = Path(sys.prefix)  # the environment the suite runs in is the README's .venv
        # the user's cache stays untouched: the commands share one of the session's (the probe measured once)
        env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), HF_HUB_OFFLINE="1",
                   XDG_DATA_HOME=str(tmp_path / "data"), XDG_CACHE_HOME=str(tmp_path_factory.getbasetemp() / "readme-cache"),
                   COLUMNS="120")
        done = subprocess.run(["bash", "-c", f"{ACTIVATE} 2>/dev/null || true; {_runnable(command)}"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == detail, (f"{name}:{line}: {command!r} exited {done.returncode}, expected {detail}\n"
                                           f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        if detail == 0:
            assert "command not found" not in done.stderr
