from __future__ import annotations

import base64
import csv
import io
import json
import math
import re

import matplotlib
import pytest

from mixprec.bench import export, plots, report, table

EVIL_NAME = "<script>alert(1)</script>"
EVIL_ERROR = "RuntimeError: A & B <b>bold</b> failed"


def _config(name, batch=1, *, samples=(1.93, 1.95, 1.92, 1.94, 1.96, 1.93), **metrics):
    base = {
        "latency_median": sorted(samples)[len(samples) // 2] if samples else None,
        "latency_ci_low": min(samples) if samples else None,
        "latency_ci_high": max(samples) if samples else None,
        "weight_bytes": 591_000_000,
        "peak_mem_bytes": 1_234_567_890,
    }
    base.update(metrics)
    return {"name": name, "batch": batch, "status": "ok", "error": None,
            "policy": {"version": 1, "name": name, "rules": [{"match": "type:*Norm", "keep_fp32": True}]},
            "samples": list(samples), "metrics": base}


def _failed(name, status, error):
    return {"name": name, "batch": 1, "status": status, "error": error, "policy": None, "samples": [], "metrics": {}}


def sample_run():
    return {
        "id": 3,
        "started": "2026-11-22 07:40:01",
        "finished": "2026-11-22 07:43:10",
        "status": "complete",
        "pipeline": "tts",
        "size": "default",
        "machine": {"device_type": "cpu", "name": "Intel(R) Xeon(R) Processor", "threads": 2,
                    "memory_bytes": 25276514304, "cpu_flags": ["avx2", "avx512_bf16"],
                    "dtypes": {"bf16": {"klass": "fast", "ratio": 3.9}, "fp16": {"klass": "emulated", "ratio": 0.007}}},
        "versions": {"torch": "2.13.0+cpu", "mixprec": "0.1.0", "python": "3.11.7"},
        "notes": ["fp16 configurations left out: the probe measured fp16 emulated & slow <0.01x>"],
        "configs": [
            _config("fp32", speedup=1.0, sqnr_db=math.inf, snr_db=math.inf, lsd_db=0.0, max_abs_err=0.0,
                    rel_err=0.0, cosine=1.0, rtf=0.96, tokens_per_s=25.9, token_agreement=1.0, nonfinite=0,
                    fallbacks=0, throughput_items_per_s=0.51),
            _config("bf16", samples=(0.61, 0.62, 0.60, 0.63, 0.61, 0.62), speedup=3.1, sqnr_db=31.4,
                    snr_db=30.2, lsd_db=0.41, max_abs_err=0.012, rel_err=0.027, cosine=0.9996, rtf=0.31,
                    token_agreement=0.98, nonfinite=0, fallbacks=1),
            _config(EVIL_NAME, samples=(0.9, 0.95, 0.92), speedup=2.0, sqnr_db=20.0, snr_db=19.0),
            _failed("fp16", "failed", EVIL_ERROR),
            _failed("tf32", "timeout", "timed out after 600 s"),
        ],
    }


@pytest.fixture
def run():
    return sample_run()


def test_render_html_escapes_user_text(run):
    page = report.render_html([run])
    assert EVIL_NAME not in page
    assert html_escaped(EVIL_NAME) in page
    assert "<b>bold</b>" not in page
    assert "A &amp; B &lt;b&gt;bold&lt;/b&gt; failed" in page
    assert "emulated &amp; slow &lt;0.01x&gt;" in page
    assert "Intel(R) Xeon(R) Processor" in page


def html_escaped(text):
    import html

    return html.escape(text, quote=True)


def test_render_html_is_self_contained(run):
    page = report.render_html([run], title="bench <1>")
    assert page.startswith("<!DOCTYPE html>")
    assert "data:image/png;base64," in page
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page.lower()
    assert "<title>bench &lt;1&gt;</title>" in page
    for encoded in re.findall(r'data:image/png;base64,([A-Za-z0-9+/=]+)"', page):
        assert base64.b64decode(encoded).startswith(b"\x89PNG\r\n\x1a\n")


def test_render_html_shows_failures_exact_and_notes(run):
    page = report.render_html([run])
    assert ">failed<" in page and ">timeout<" in page
    assert "timed out after 600 s" in page
    assert ">exact<" in page
    assert "Notes" in page
    assert "2.13.0+cpu" in page


def test_render_html_is_deterministic(run):
    assert report.render_html([run]) == report.render_html([run])


def test_render_html_of_several_runs_and_batches(run):
    other = dict(run, id=4, pipeline="diffusion",
                 configs=[_config("fp32", psnr_db=math.inf, ssim=1.0),
                          _config("bf16", psnr_db=41.5, ssim=0.998),
                          _config("fp32", batch=4, psnr_db=math.inf),
                          _config("bf16", batch=4, psnr_db=40.0)])
    page = report.render_html([run, other])
    assert 'href="#run-3"' in page and 'href="#run-4"' in page
    assert "diffusion, batch 4" in page
    assert "PSNR" in page


def test_render_html_of_odd_runs():
    empty = {"id": 1, "pipeline": "minilm", "status": "incomplete", "configs": []}
    only_failed = {"id": 2, "pipeline": "minilm", "status": "incomplete",
                   "configs": [_failed("bf16", "failed", "boom")]}
    page = report.render_html([empty, only_failed])
    assert page.count("Not a final result (interrupted)") == 2 and "Interrupted: it never finished" in page
    assert "Nothing measured: it has no configuration" in page and "Nothing measured: every configuration failed" in page
    assert "boom" in page
    assert report.render_html([]).count("no runs") == 1


def test_rendering_leaves_the_matplotlib_backend_alone(run):
    before = matplotlib.get_backend()
    report.render_html([run])
    plots.main_plot_png(run)
    assert matplotlib.get_backend() == before


def test_main_plot_png(run):
    png = plots.main_plot_png(run)
    assert isinstance(png, bytes)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert b"matplotlib.org" not in png  # no metadata chunk
    with pytest.raises(ValueError, match="no batch 8"):
        plots.main_plot_png(run, batch=8)


def test_main_plot_png_without_measurements():
    run = {"id": 1, "pipeline": "tts", "configs": [_failed("fp32", "failed", "x")]}
    assert plots.main_plot_png(run).startswith(b"\x89PNG")


def test_main_quality_key(run):
    assert plots.main_quality_key(run) == "snr_db"
    assert plots.main_quality_key({"configs": [_config("a", sqnr_db=3.0)]}) == "sqnr_db"
    assert plots.main_quality_key({"configs": [_config("a", psnr_db=30.0, sqnr_db=3.0)]}) == "psnr_db"


def test_table_rows_are_plain_formatted_text(run):
    rows = table.render_table_rows(run)
    assert [r["config"] for r in rows] == ["fp32", "bf16", EVIL_NAME, "fp16", "tf32"]
    assert len({tuple(r) for r in rows}) == 1  # same keys on every row
    fp32, bf16, evil, fp16, tf32 = rows
    assert fp32["sqnr"] == "exact" and fp32["snr"] == "exact"
    assert fp32["latency"] == "1.94 s"
    assert bf16["latency"] == "620 ms"
    assert bf16["ci"] == "600 ms – 630 ms"
    assert bf16["speedup"] == "3.15x (3.10–3.21)"  # the stored 3.1 had no interval: paired from the samples
    assert fp32["speedup"] == "reference" and evil["speedup"] == "2.09x (2.05–2.14)"
    assert bf16["sqnr"] == "31.4 dB"
    assert bf16["weights"] == "563.6 MiB"
    assert bf16["token_agreement"] == "98.0%"
    assert bf16["policy"] == "bf16"
    assert evil["config"] == EVIL_NAME  # escaping is the HTML renderer's job
    assert evil["lsd"] == "—" and evil["rtf"] == "—"
    assert fp16["status"] == "failed" and fp16["error"] == EVIL_ERROR and fp16["latency"] == "—"
    assert tf32["status"] == "timeout"
    assert fp32["error"] == ""
    assert "psnr" not in fp32  # no config measured it
    assert set(fp32) <= {key for key, _ in table.COLUMNS}


def test_table_rows_compute_latency_from_samples_when_metrics_lack_it():
    config = {"name": "x", "batch": 1, "status": "ok", "samples": [0.010, 0.011, 0.012], "metrics": {}}
    (row,) = table.render_table_rows({"configs": [config]})
    assert row["latency"] == "11.0 ms"
    assert row["ci"].endswith("(min–max)")


def test_to_csv(run):
    text = export.to_csv([run])
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == len(run["configs"])
    header = text.splitlines()[0].split(",")
    assert header[:3] == ["run_id", "pipeline", "size"]
    assert {"config", "status", "error", "latency_median", "sqnr_db"} <= set(header)
    assert rows[0]["sqnr_db"] == "inf"
    assert rows[2]["config"] == EVIL_NAME
    assert rows[3]["error"] == EVIL_ERROR
    assert rows[3]["latency_median"] == ""


def test_to_json(run):
    data = json.loads(export.to_json([run]))
    assert len(data) == len(run["configs"])
    assert data[0]["sqnr_db"] == "inf"
    assert data[0]["samples"] == run["configs"][0]["samples"]
    assert data[0]["policy"]["name"] == "fp32"
    assert data[3]["status"] == "failed" and data[3]["policy"] is None
    assert "Infinity" not in export.to_json([run])


def test_save_html(run, tmp_path):
    path = report.save_html([run], tmp_path / "report.html")
    assert path.read_text(encoding="utf-8") == report.render_html([run])


def test_table_rows_show_the_exception_line_and_exports_keep_the_traceback():
    error = ("RuntimeError: could not create a primitive descriptor for the LSTM forward propagation primitive.\n"
             "Traceback (most recent call last):\n  File \"worker.py\", line 80, in main\n    out = pipe.run(x)\n")
    run = {"id": 1, "pipeline": "tts", "size": "test", "status": "complete", "configs": [_failed("autocast-bf16", "failed", error)]}
    (row,) = table.render_table_rows(run)
    assert row["error"] == "RuntimeError: could not create a primitive descriptor for the LSTM forward propagation primitive."
    assert "Traceback" not in report.render_html([run])
    assert "Traceback (most recent call last)" in json.loads(export.to_json([run]))[0]["error"]
