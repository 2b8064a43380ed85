"""The console's width is decided per command, not when the CLI module was first imported."""

from __future__ import annotations

from typer.testing import CliRunner

from mixprec.cli import _common
from mixprec.cli._app import app


def test_each_command_takes_the_width_of_where_its_output_goes_now(monkeypatch):
    runner = CliRunner()
    monkeypatch.setenv("COLUMNS", "97")
    assert runner.invoke(app, ["presets"]).exit_code == 0
    assert _common.console.width == 97  # COLUMNS of this command
    monkeypatch.delenv("COLUMNS")
    assert runner.invoke(app, ["presets"]).exit_code == 0
    assert _common.console.width == _common.PIPE_WIDTH  # a pipe, whatever an earlier command had
    monkeypatch.setenv("COLUMNS", "123")
    assert runner.invoke(app, ["presets"]).exit_code == 0
    assert _common.console.width == 123
