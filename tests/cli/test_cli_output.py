"""User text reaches the terminal as text: never Rich markup, control characters escaped, headers whole."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from mixprec.bench.store import Store
from mixprec.cli import app
from mixprec.cli._common import table
from mixprec.cli._text import clean, json_text, say

runner = CliRunner()

# Any raw control character but newline and tab, as a terminal would act on it.
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
HOSTILE = "[/data/weights.bin] [link=https://evil.example]click[/link] [bold]x\x1b]8;;https://evil.example\x07y\x1b[2Jz\x9b31m\u202eRTL\nnext"


def _render(renderable, width=120) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=True, color_system="truecolor").print(renderable)
    return out.getvalue()


def test_clean_escapes_every_control_character_and_keeps_text():
    assert clean("a\x1b[31mb") == "a\\x1b[31mb"
    assert clean("osc\x1b]8;;u\x07") == "osc\\x1b]8;;u\\x07"
    assert clean("c1\x9bm") == "c1\\x9bm"
    assert clean("bidi\u202eevil") == "bidi\\u202eevil"
    assert clean("two\nlines") == "two\\nlines"
    assert clean("two\nlines", newlines=True) == "two\nlines"
    assert clean("tab\there") == "tab\there"
    assert clean("漢字 עברית [/]") == "漢字 עברית [/]"
    assert clean(None) == "-"


def test_table_shows_markup_literally_and_escapes_controls():
    text = _render(table("t [/x]", ["module", "error"], [[HOSTILE, "FileNotFoundError('cannot open [/data/weights.bin]')"]]),
                   width=400)
    assert "[/data/weights.bin]" in text and "[link=https://evil.example]click[/link]" in text
    assert "cannot open [/data/weights.bin]" in text
    assert "\x1b]8;" not in text  # no hyperlink escape reached the terminal
    assert "\\x1b]8;;https://evil.example\\x07" in text and "\\u202e" in text and "\\x9b" in text
    assert "t [/x]" in text


def test_say_prints_user_text_verbatim():
    out = io.StringIO()
    say(Console(file=out, width=300, force_terminal=True), ("error:", "bold red"), " ", HOSTILE)
    text = out.getvalue()
    assert "[bold]x" in text and "\\x1b[2J" in text
    assert "\x1b[2J" not in text and "\x1b]8" not in text
    assert text.count("\n") == 2  # a message's own line break kept, nothing else


@pytest.mark.parametrize("width", [30, 40, 60, 80, 120])
def test_headers_never_break_inside_a_word(width):
    rows = [["fp16+keep-fp32-attention-and-norms", "0.0123 s", "34.5", "1.00x", "x" * 60]]
    text = _render(table("run", ["Configuration", "Latency", "SQNR", "Speedup", "Error"], rows), width=width)
    for word in ("Configuration", "Latency", "SQNR", "Speedup", "Error", "0.0123 s"):
        assert word in text, text
    assert max(len(line) for line in re.sub("\x1b\\[[0-9;]*m", "", text).splitlines()) <= width


def test_json_text_escapes_controls_inside_strings_and_stays_json():
    raw = json.dumps({"name": "a\x85b\u202ec"}, ensure_ascii=False, indent=2)
    shown = json_text(raw)
    assert not RAW_CONTROL.search(shown)
    assert json.loads(shown) == {"name": "a\x85b\u202ec"}


@pytest.fixture
def hostile_db(tmp_path, clean_env):
    """A store whose runs, configurations and errors hold markup and control characters."""
    clean_env.chdir(tmp_path)
    db = tmp_path / "b.sqlite"
    with Store(db) as store:
        for _ in range(2):
            run_id = store.start_run(pipeline="p[/]\x1b[31mred", size="test", machine={"name": "m[/b]"}, fingerprint="f",
                                     versions={}, notes=["note [/] \x1b]0;title\x07"], command="mixprec bench")
            config_id = store.add_config(run_id, position=0, name="=cfg[/]\x1b[2J", batch=1)
            store.add_sample(config_id, 0, 0.01)
            store.finish_config(config_id, status="error", metrics={"latency_median": 0.01},
                                error="FileNotFoundError('cannot open [/data/weights.bin]')")
            store.finish_run(run_id)
    return db


@pytest.mark.parametrize("args", [["runs", "list"], ["runs", "show", "1"], ["runs", "show", "1", "--json"],
                                  ["compare", "1", "2"], ["gate", "2", "--baseline", "1"]])
def test_store_contents_print_verbatim(hostile_db, args):
    result = runner.invoke(app, [*args, "--db", str(hostile_db)])
    assert result.exit_code in (0, 1, 2), result.output  # 2: the gate cannot decide on a baseline that measured nothing
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert not RAW_CONTROL.search(result.output), repr(result.output)
    if args[:2] == ["runs", "show"] and "--json" not in args:
        assert "cannot open [/data/weights.bin]" in result.output
        assert "note [/] \\x1b]0;title\\x07" in result.output
    if args[0] == "runs" and "--json" not in args:
        assert "p[/]\\x1b[31mred" in result.output


def test_db_path_with_markup(tmp_path, clean_env):
    clean_env.chdir(tmp_path)
    (tmp_path / "dir[").mkdir()
    result = runner.invoke(app, ["runs", "list", "--db", "dir[/]b.sqlite"])
    assert result.exit_code == 0, result.output
    assert "dir[/]b.sqlite" in result.output.replace("\n", "")


def test_config_show_with_a_markup_file_name(tmp_path, clean_env):
    clean_env.chdir(tmp_path)
    (tmp_path / "cfg[").mkdir()
    (tmp_path / "cfg[" / "]x.toml").write_text('float32_matmul_precision = "high"\n')
    result = runner.invoke(app, ["config", "show", "--config", "cfg[/]x.toml"])
    assert result.exit_code == 0, result.output
    assert "cfg[/]x.toml" in result.output
    missing = runner.invoke(app, ["config", "show", "--config", "no[/]such.toml"])
    assert missing.exit_code == 2 and "no[/]such.toml" in missing.output


def test_unknown_env_variable_with_markup_is_warned_verbatim(tmp_path, clean_env):
    clean_env.chdir(tmp_path)
    result = runner.invoke(app, ["config", "show"], env={"MIXPREC_[/]X\x1b[31m": "1"})
    assert result.exit_code == 0, result.output
    assert "MIXPREC_[/]X\\x1b[31m" in result.output and not RAW_CONTROL.search(result.output)


_FACTORIES = '''
import torch
from torch import nn
from mixprec.pipelines import EmbeddingOutput, Pipeline


class Net(nn.Module):
    def __init__(self, raises):
        super().__init__()
        # A child module name may hold any text but '.': here Rich markup.
        self.add_module("lin[link=https://evil]x[/link]", nn.Linear(4, 4))
        self.raises = raises

    def forward(self, x):
        if self.raises:
            raise FileNotFoundError("cannot open [/data/weights.bin]")
        return getattr(self, "lin[link=https://evil]x[/link]")(x)


class Odd(Pipeline):
    name = "odd[/]"
    output_kind = "embedding"

    def __init__(self, raises=False):
        super().__init__({"net": Net(raises)})

    def _example_inputs(self, batch, seed):
        return torch.randn(batch, 4, generator=torch.Generator().manual_seed(seed))

    def _run(self, inputs):
        return EmbeddingOutput(output=self.components["net"](inputs).float())


def fine(size="default", seed=0):
    return Odd()


def broken(size="default", seed=0):
    return Odd(raises=True)
'''


@pytest.fixture
def odd_project(tmp_path, clean_env):
    (tmp_path / "odd.py").write_text(_FACTORIES)
    clean_env.chdir(tmp_path)
    return tmp_path


def test_bench_with_a_markup_error_keeps_its_table_and_store_line(odd_project):
    result = runner.invoke(app, ["bench", "--pipeline", "odd.py:broken", "--size", "test", "--configs", "fp32",
                                 "--repeat", "1", "--warmup", "0", "--db", "dir[/]b.sqlite", "--csv", "o.csv"]
                           ) if (odd_project / "dir[").mkdir() is None else None
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    flat = result.output.replace("\n", "")
    assert "cannot open [/data/weights.bin]" in flat
    assert "stored as run(s) 1 in dir[/]b.sqlite" in flat
    assert (odd_project / "o.csv").is_file()


@pytest.mark.parametrize("command", [["explain", "--preset", "memory"], ["diagnose", "--preset", "memory"]])
def test_module_names_with_markup(odd_project, command):
    result = runner.invoke(app, [command[0], "--pipeline", "odd.py:fine", *command[1:]])
    assert result.exit_code == 0, result.output
    assert "lin[link=https://evil]x[/link]" in result.output.replace("\n", "")
    assert "\x1b]8;" not in result.output


def test_policy_file_with_markup_name(odd_project):
    (odd_project / "odd[").mkdir()
    (odd_project / "odd[" / "]name.toml").write_text(
        'name = "odd[/]name"\n[[rules]]\nmatch = "*"\nstorage = "bf16"\nreason = "all [/] in bf16"\n')
    result = runner.invoke(app, ["explain", "--pipeline", "odd.py:fine", "--policy", "odd[/]name.toml"])
    assert result.exit_code == 0, result.output
    assert "all [/] in bf16" in result.output.replace("\n", "")
    missing = runner.invoke(app, ["explain", "--pipeline", "odd.py:fine", "--policy", "nope[/]x.toml"])
    assert missing.exit_code == 2 and "nope[/]x.toml" in missing.output


def test_pipelines_lists_a_broken_plugin_verbatim(monkeypatch):
    from mixprec.pipelines import _registry

    monkeypatch.setattr(_registry, "_plugins", {})  # discovery done: one plugin failed to load
    monkeypatch.setitem(_registry._errors, "bad[/]plugin", "cannot load 'x:y': ImportError: no module [/x]\x1b[31m")
    result = runner.invoke(app, ["pipelines", "--size", "test"])
    assert result.exit_code == 0, result.output
    flat = result.output.replace("\n", "")
    assert "plugin 'bad[/]plugin' failed to load" in flat and "no module [/x]\\x1b[31m" in flat
    # (transformers' own weight-loading bar writes carriage returns before the table)
    assert not RAW_CONTROL.search(result.output[result.output.index("Pipelines (size=test)"):])


def test_fallbacks_list_prints_stored_names_verbatim(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    (tmp_path / "fallbacks.json").write_text(json.dumps({"fp[/]\x1b[31m": {
        "model": "m[link=https://evil.example]x", "pins": {"enc[/].0\x1b]0;t\x07": "fp32"}, "updated": "now"}}))
    result = runner.invoke(app, ["fallbacks", "list"])
    assert result.exit_code == 0, result.output
    flat = result.output.replace("\n", "")
    assert "fp[/]\\x1b[31m" in flat and "enc[/].0\\x1b]0;t\\x07" in flat
    assert not RAW_CONTROL.search(result.output)


def test_usage_errors_escape_what_was_typed():
    for args, shown in ((["presets", "--device", "", "\u202a"], "\\u202a"), (["--bogus\x9b"], "--bogus\\x9b"),
                        (["runs", "list", "--db", "x", "\x1b[2J"], "\\x1b[2J")):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and shown in result.output, result.output
        assert not RAW_CONTROL.search(result.output)


def test_json_output_escapes_what_a_terminal_would_act_on(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    (tmp_path / "fallbacks.json").write_text(json.dumps({"k\udcff\x85\u202e": {"pins": {"m\x9b": "fp32"}}}))
    result = runner.invoke(app, ["fallbacks", "list", "--json"])
    assert result.exit_code == 0 and not RAW_CONTROL.search(result.output) and "\udcff" not in result.output
    assert json.loads(result.output)["fallbacks"] == {"k\udcff\x85\u202e": {"pins": {"m\x9b": "fp32"}}}


def test_a_fallback_store_that_is_not_utf8_is_ignored_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    (tmp_path / "fallbacks.json").write_bytes(b"\xff{}")
    with pytest.warns(UserWarning, match=r"not UTF-8 text \(byte 0 is 0xff\)"):
        result = runner.invoke(app, ["fallbacks", "list"])
    assert result.exit_code == 0 and "Remembered fallbacks" in result.output


def test_warnings_from_the_console_script_are_escaped(tmp_path):
    cache = tmp_path / "c\x1b[31m"
    cache.mkdir()
    (cache / "fallbacks.json").write_bytes(b"\xff")
    script = Path(sys.executable).parent / "mixprec"
    result = subprocess.run([str(script), "fallbacks", "list"], env={**os.environ, "MIXPREC_CACHE_DIR": str(cache)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "warning: ignoring fallback store" in result.stderr and "c\\x1b[31m" in result.stderr
    assert "\x1b" not in result.stderr + result.stdout
