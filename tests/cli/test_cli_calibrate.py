"""``mixprec calibrate`` and ``explain --calibrate``: what they print and remember (no timing is asserted)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from mixprec.cli import app

runner = CliRunner()


def test_calibrate_remembers_and_the_next_run_reuses_it(tmp_path, monkeypatch, bf16_cpu):
    """On a CPU with native bf16 (elsewhere fast has nothing to choose and nothing to remember)."""
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    args = ["calibrate", "--pipeline", "tts", "--size", "test", "--preset", "fast", "--time-limit", "4", "--json"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    data = json.loads(first.output)["calibrations"]["fast"]
    labels = [f["label"] for f in data["figures"]]
    assert labels[:2] == ["rules", "fp32"] and data["chosen"] in labels
    assert data["source"] == "measured" and data["clock"] == "cpu-time"
    if data["decided"]:
        again = json.loads(runner.invoke(app, args).output)["calibrations"]["fast"]
        assert again["source"] == "cache" and again["chosen"] == data["chosen"]
        listed = runner.invoke(app, ["calibrate", "--list", "--json"])
        remembered = json.loads(listed.output)
        assert {r["preset"] for r in remembered} == {"fast"}
        assert {r.get("component") for r in remembered} >= {None}  # the whole model's, and its components'
        assert "component" in runner.invoke(app, ["calibrate", "--list"]).output
    cleared = runner.invoke(app, ["calibrate", "--clear"])
    assert cleared.exit_code == 0 and cleared.output.startswith("forgot ")
    assert json.loads(runner.invoke(app, ["calibrate", "--list", "--json"]).output) == []


def test_calibrate_text_and_explain_show_the_figures(tmp_path, monkeypatch, bf16_cpu):
    """On a CPU with native bf16, memory's candidates are timed and shown (elsewhere its level needs no timing)."""
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    out = runner.invoke(app, ["explain", "--pipeline", "tts", "--size", "test", "--preset", "memory", "--calibrate"])
    assert out.exit_code == 0, out.output
    assert "calibrated: memory: " in out.output and "tts: memory's candidates" in out.output
    assert "naive-bf16" in out.output and "against the incumbent" in out.output
    # tts has several components: each is shown with its share, what it kept and its own error.
    assert "tts: memory calibrated per component" in out.output and "own SQNR" in out.output
    assert all(name in out.output for name in ("t3", "s3gen", "vocoder"))


def test_bad_flags_are_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    for args, message in [
        (["calibrate"], "give --pipeline"),
        (["calibrate", "--pipeline", "tts", "--preset", "fsat"], "--preset: unknown preset 'fsat'"),
        (["calibrate", "--pipeline", "tts", "--time-limit", "0"], "--time-limit 0.0: give a positive number"),
        (["calibrate", "--pipeline", "tts", "--refresh", "--no-cache"], "give one of them"),
        (["calibrate", "--pipeline", "tts", "--batch", "zero"], "--batch 'zero': expected an integer"),
        (["explain", "--pipeline", "tts", "--policy", "p.toml", "--calibrate"], "give --preset, not --policy"),
    ]:
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and message in result.output, (args, result.output)
