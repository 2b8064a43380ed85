"""Every option that takes a closed set of values lists each of them in its ``--help``.

The expected values are read from the tables the CLI checks them against, so a value
added to a table and missing from the help fails here. Every value-taking option of
every command is either one of those or named below as free-form (a path, a number,
a name), so a new closed-set option cannot go unchecked.
"""

from __future__ import annotations

import re

import pytest
import typer.main
from typer.testing import CliRunner

from mixprec import pipelines
from mixprec._languages import LANGUAGES
from mixprec.bench.configs import BUILTIN, CALIBRATED_SUFFIX, COMPILE_SUFFIX
from mixprec.bench.gate import SIZE_UNITS
from mixprec.cli import app
from mixprec.cli._cluster import EXECUTORS
from mixprec.device.hardware import DEVICE_TYPES
from mixprec.device.settings import FALSE_WORDS, MATMUL_LEVELS, TRUE_WORDS
from mixprec.policy.presets import PRESETS
from mixprec.tuning.bounds import METRICS, OPS
from mixprec.tuning.tuner import OBJECTIVES

runner = CliRunner()


def _sizes() -> list[str]:
    return list(dict.fromkeys(size for name in pipelines.builtin_names() for size in pipelines.size_notes(name)))


_BOOLS = [*TRUE_WORDS, *FALSE_WORDS]

#: Option -> the values its help must list; a ``(command, option)`` key overrides the option's.
CLOSED: dict[object, list[str]] = {
    "--size": _sizes(),
    "--device": [*DEVICE_TYPES, "cuda:N"],
    "--preset": list(PRESETS),
    "--configs": [*BUILTIN, f"NAME{COMPILE_SUFFIX}", f"PRESET{CALIBRATED_SUFFIX}"],
    "--objective": list(OBJECTIVES),
    "--executor": list(EXECUTORS),
    "--bound": [*METRICS, *OPS],
    "--float32-matmul-precision": list(MATMUL_LEVELS),
    "--conv-tf32": _BOOLS,
    "--fp16-reduced-precision-reduction": _BOOLS,
    "--bf16-reduced-precision-reduction": _BOOLS,
    "--lang": list(LANGUAGES),
    "--pipeline": pipelines.builtin_names(),
    "--ray-address": ["auto"],
    "--hardware": ["all"],
    "--memory-noise-floor": list(SIZE_UNITS),
    ("run", "--out"): [ext for exts in pipelines.EXTENSIONS.values() for ext in exts],
}

#: Options whose value is free-form: a path, a number, a duration, a threshold, a name or an address.
FREE = {"--app", "--config", "--env-file", "--policy", "--seed", "--seeds", "--validation-seeds", "--top", "--db",
        "--batch", "--time-limit", "--repeat", "--warmup", "--timeout", "--html", "--json", "--csv", "--out", "--budget",
        "--baseline", "--max-quality-drop", "--max-latency-regression", "--max-memory-increase", "--max-failure-rate",
        "--min-quality", "--workers", "--worker-cpus", "--margin", "--host", "--port",
        "--store-dir"}


def _commands(command, path=()):
    subs = getattr(command, "commands", None)
    if subs:
        for name, sub in subs.items():
            yield from _commands(sub, (*path, name))
    else:
        yield path, command


def _valued_options() -> list[tuple[tuple[str, ...], str]]:
    """(command path, long option) of every option that takes a value."""
    root = typer.main.get_command(app)
    return [(path, long) for path, command in _commands(root) for param in command.params
            if param.param_type_name == "option" and not param.is_flag
            for long in [next(o for o in param.opts if o.startswith("--"))]]


def _option_help(text: str, option: str) -> str:
    """The help of ``option`` in a rendered ``--help``: its row and the rows it wraps onto, as one line."""
    lines = [line.strip("│ \n") for line in text.splitlines()]
    for index, line in enumerate(lines):
        tokens = line.replace("*", " ").split()
        if tokens and tokens[0] == option:
            row = [line]
            for more in lines[index + 1:]:
                first = more.replace("*", " ").split()
                if not first or first[0].startswith("-") or more.startswith(("╰", "╭")):
                    break
                row.append(more)
            return " ".join(" ".join(row).split())
    raise AssertionError(f"{option} is not in the help:\n{text}")


def _lists(help_text: str, value: str) -> bool:
    """``value`` appears as a whole word (``high`` is not found in ``highest``, ``>`` not in ``>=``)."""
    return re.search(rf"(?<![\w<>=:-]){re.escape(value)}(?![\w<>=-]|:\w)", help_text) is not None


def _help(path: tuple[str, ...]) -> str:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_every_value_taking_option_is_classified():
    unclassified = sorted({(" ".join(path), option) for path, option in _valued_options()
                           if option not in CLOSED and (path[-1], option) not in CLOSED and option not in FREE})
    assert not unclassified, f"options neither checked for their values nor named free-form: {unclassified}"


@pytest.mark.parametrize(("path", "option"), [(p, o) for p, o in _valued_options()
                                               if o in CLOSED or (p[-1], o) in CLOSED])
def test_help_lists_every_accepted_value(path, option):
    expected = CLOSED.get((path[-1], option), CLOSED.get(option))
    shown = _option_help(_help(path), option)
    missing = [value for value in expected if not _lists(shown, value)]
    assert not missing, f"mixprec {' '.join(path)} --help: {option} does not list {missing}: {shown!r}"


def test_bench_size_names_large():
    assert "large" in _sizes()  # the GPU-sized pipelines: the size the help must not leave out
    assert _lists(_option_help(_help(("bench",)), "--size"), "large")


def test_a_value_added_to_a_source_appears_in_the_help(monkeypatch):
    """The help is built from the tables themselves: a size a pipeline gains is listed."""
    from mixprec.cli import _choices
    from mixprec.pipelines import tts

    monkeypatch.setitem(tts.SIZE_NOTES, "huge", "benchmarks on several GPUs: a larger T3")
    assert "huge (benchmarks on several GPUs; tts only)" in _choices.size_help()


def test_option_help_finds_a_missing_value():
    text = "│ --size   <str>   Pipeline size: default or test.  │\n│ --seed   <int>   Seed; large.  │"
    shown = _option_help(text, "--size")
    assert not _lists(shown, "large") and _lists(shown, "test") and not _lists("highest", "high")
