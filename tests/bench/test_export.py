"""JSON and CSV export of stored runs: NaN reads ``nan``, a metric never measured is empty."""

from __future__ import annotations

import csv
import io
import json
import math
import sqlite3

from mixprec.bench import export
from mixprec.bench.store import Store


def _stored(tmp_path):
    path = tmp_path / "e.sqlite"
    with Store(path) as store:
        run_id = store.start_run(pipeline="tts", size="test", machine={"name": "m"}, fingerprint="f", versions={},
                                 notes=[])
        cid = store.add_config(run_id, position=0, name="fp32", batch=1)
        store.finish_config(cid, status="ok", metrics={"sqnr_db": float("inf"), "cosine": math.nan, "ssim": None,
                                                       "nonfinite": 0})
        other = store.add_config(run_id, position=1, name="fast", batch=1)
        store.finish_config(other, status="ok", metrics={"sqnr_db": 40.0, "ssim": 0.9, "cosine": 1.0, "nonfinite": 0})
        store.finish_run(run_id)
        run = store.load_run(run_id)
    return path, run


def test_nan_is_stored_as_null_and_exported_as_nan(tmp_path):
    path, run = _stored(tmp_path)
    with sqlite3.connect(path) as db:
        rows = dict(db.execute("SELECT name, value FROM metrics WHERE config_id = 1").fetchall())
    assert rows == {"sqnr_db": float("inf"), "cosine": None, "nonfinite": 0}  # None was not measured: no row
    data = {item["config"]: item for item in json.loads(export.to_json([run]))}
    assert data["fp32"]["cosine"] == "nan" and data["fp32"]["sqnr_db"] == "inf"
    assert data["fp32"]["ssim"] is None and data["fast"]["ssim"] == 0.9
    table = {row["config"]: row for row in csv.DictReader(io.StringIO(export.to_csv([run])))}
    assert table["fp32"]["cosine"] == "nan" and table["fp32"]["sqnr_db"] == "inf" and table["fp32"]["ssim"] == ""
    assert table["fast"]["cosine"] == "1.0"
