"""CSV export: text cells a spreadsheet would run as formulas are neutralised; numbers stay numbers."""

from __future__ import annotations

import csv
import io
import math

import pytest

from mixprec.bench import export


def _run(name: str, error: str | None = None, pipeline: str = "tts") -> dict:
    return {"id": 1, "started": "s", "finished": "f", "status": "complete", "pipeline": pipeline, "size": "default",
            "machine": {"name": "@machine"}, "versions": {"torch": "2"},
            "configs": [{"name": name, "batch": 1, "status": "ok", "error": error,
                         "policy": {"name": name, "rules": []}, "samples": [0.1],
                         "metrics": {"latency_median": 0.1, "speedup": -1.5, "sqnr_db": -math.inf, "nonfinite": -3}}]}


def _row(run: dict) -> dict:
    return next(csv.DictReader(io.StringIO(export.to_csv([run]))))


@pytest.mark.parametrize("name", ["=1+2.toml", "+1", "-2+3", "@SUM(A1:A9)", "\tcmd",
                                  "=HYPERLINK(\"http://evil\",\"x\")", "=cmd|' /C calc'!A0"])
def test_formula_like_names_are_quoted(name):
    row = _row(_run(name))
    assert row["config"] == "'" + name
    assert row["policy_name"] == "'" + name


def test_other_text_fields_are_quoted_too():
    row = _row(_run("fp32", error="=2+5 failed", pipeline="-tts"))
    assert row["error"] == "'=2+5 failed"
    assert row["pipeline"] == "'-tts"
    assert row["device"] == "'@machine"


def test_numbers_stay_numbers():
    row = _row(_run("fp32"))
    assert row["config"] == "fp32"
    assert row["speedup"] == "-1.5" and row["sqnr_db"] == "-inf" and row["nonfinite"] == "-3"
    assert row["batch"] == "1" and row["run_id"] == "1"


def test_json_keeps_names_exactly():
    import json

    assert json.loads(export.to_json([_run("=1+2.toml")]))[0]["config"] == "=1+2.toml"


def test_carriage_returns_stay_inside_their_cell():
    rows = list(csv.DictReader(io.StringIO(export.to_csv([_run("\rcmd", error="line one\rline two\r\nthree")]))))
    assert len(rows) == 1
    assert rows[0]["config"] == "'\ncmd"
    assert rows[0]["error"] == "line one\nline two\nthree"
