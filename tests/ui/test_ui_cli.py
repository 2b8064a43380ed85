"""``mixprec ui``: options, the language check and a missing Gradio install."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from mixprec.cli import app

runner = CliRunner()


def test_unsupported_language_exits_2_naming_the_languages():
    pytest.importorskip("gradio")
    result = runner.invoke(app, ["ui", "--lang", "xx"])
    assert result.exit_code == 2
    assert "--lang: unsupported language 'xx'; choose one of: en, zh, ja, he" in result.output


def test_missing_gradio_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "gradio", None)  # what Python does for a package that is not installed
    for name in [m for m in sys.modules if m == "mixprec.ui" or m.startswith("mixprec.ui.")]:
        monkeypatch.delitem(sys.modules, name)
    result = runner.invoke(app, ["ui"])
    assert result.exit_code == 2
    assert "the mixprec web UI needs gradio" in result.output and "pip install 'mixprec[ui]'" in result.output


def test_options_reach_the_server(monkeypatch):
    gr = pytest.importorskip("gradio")
    calls = []
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kw: calls.append((self, kw)))
    with pytest.warns(UserWarning, match="bound to 0.0.0.0"):
        result = runner.invoke(app, ["ui", "--host", "0.0.0.0", "--port", "7999", "--lang", "he"])
    assert result.exit_code == 0, result.output
    [(demo, kwargs)] = calls
    assert kwargs == {"server_name": "0.0.0.0", "server_port": 7999}
    from mixprec.ui.i18n import t

    assert demo.title == t("app.title", "he")
