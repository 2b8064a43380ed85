"""A small end-to-end benchmark: real workers, real pipelines (test size), real store."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mixprec import hardware
from mixprec.bench.configs import ConfigSpec, UnknownConfigError, default_configs, parse_configs
from mixprec.bench.runner import BenchOptions, run_bench
from mixprec.bench.store import Store
from mixprec.measure.executor import WORKER_ENV, LocalProcessExecutor
from mixprec.cli import app

#: For the tests of the runner itself (statuses, crashes, time limits): a pipeline whose workers
#: load in no time beyond torch's import (``build``), and one whose every run takes far longer than
#: a millisecond (``slow``). The real pipelines are measured end to end by the other tests here.
_RUNNER = Path(__file__).parents[1] / "small_factory.py"
SMALL, SLOW = f"{_RUNNER}:build", f"{_RUNNER}:slow"


def test_cli_bench_end_to_end(tmp_path, bf16_cpu):
    db, html = tmp_path / "b.sqlite", tmp_path / "report.html"
    result = CliRunner().invoke(app, [
        "bench", "--pipeline", "tts", "--size", "test", "--configs", "fp32,fast,naive-bf16", "--repeat", "2",
        "--warmup", "1", "--db", str(db), "--html", str(html), "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv"),
    ])
    assert result.exit_code == 0, result.output
    run = Store(db).load_run(1)
    assert run["status"] == "complete"
    by_name = {c["name"]: c for c in run["configs"]}
    assert set(by_name) == {"fp32", "fast", "naive-bf16"}
    for config in run["configs"]:
        assert config["status"] == "ok" and len(config["samples"]) == 2
        m = config["metrics"]
        assert m["latency_ci_low"] <= m["latency_median"] <= m["latency_ci_high"]
        assert m["weight_bytes"] > 0 and m["peak_mem_bytes"] >= 0 and m["rtf"] > 0 and m["tokens_per_s"] > 0
        assert m["token_agreement"] == pytest.approx(1.0, abs=0.2)
    assert by_name["fp32"]["metrics"]["sqnr_db"] == float("inf")
    assert 20 < by_name["fast"]["metrics"]["snr_db"] < 100
    assert by_name["fast"]["metrics"]["weight_bytes"] < by_name["fp32"]["metrics"]["weight_bytes"]
    assert by_name["fast"]["policy"]["name"] == "fast"
    # the report's numbers are the store's numbers
    exported = json.loads((tmp_path / "r.json").read_text())
    fast = next(row for row in exported if row["config"] == "fast")
    assert fast["latency_median"] == pytest.approx(by_name["fast"]["metrics"]["latency_median"])
    assert fast["samples"] == pytest.approx(by_name["fast"]["samples"])
    csv_lines = (tmp_path / "r.csv").read_text().strip().splitlines()
    assert len(csv_lines) == 4 and csv_lines[0].startswith("run_id,")
    page = html.read_text()
    assert "data:image/png;base64," in page and "naive-bf16" in page
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 6


class _Breaking(LocalProcessExecutor):
    """Starts real workers, but gives one configuration a pipeline that does not exist."""

    def start(self, serve, job):
        if job["spec"]["name"] == "memory":
            job = dict(job, pipeline="no-such-pipeline")
        return super().start(serve, job)


def test_crashing_and_slow_configurations_are_recorded_and_the_run_goes_on(tmp_path):
    hw = hardware.probe()
    specs, _ = parse_configs("fp32,memory,fast", hw)
    with Store(tmp_path / "b.sqlite") as store:
        run_id = run_bench(BenchOptions(pipeline=SMALL, configs=specs, repeat=2, warmup=0, size="test"), hw, store,
                           executor=_Breaking(env=WORKER_ENV))
        run = store.load_run(run_id)
        by_name = {c["name"]: c for c in run["configs"]}
        assert by_name["memory"]["status"] == "failed" and "no-such-pipeline" in by_name["memory"]["error"]
        assert by_name["fp32"]["status"] == "ok" and by_name["fast"]["status"] == "ok"
        assert run["status"] == "complete"
        # No --timeout: the limit follows the reference's measured time, and says so.
        (limit,) = [n for n in run["notes"] if n.startswith("batch 1: time limit")]
        assert "x the fp32 reference's" in limit and "the reference itself is not timed out" in limit

        # A limit no run keeps (the slow pipeline's runs take far more than the millisecond allowed).
        slow = run_bench(BenchOptions(pipeline=SLOW, configs=specs[:2], repeat=2, warmup=0, size="test", timeout=1e-4),
                         hw, store)
        statuses = {c["name"]: c["status"] for c in store.load_run(slow)["configs"]}
        assert statuses == {"fp32": "timeout", "memory": "timeout"}


def test_diffusion_is_teacher_forced_on_the_fp32_latents(tmp_path):
    hw = hardware.probe()
    specs, _ = parse_configs("fp32,naive-bf16", hw)
    with Store(tmp_path / "b.sqlite") as store:
        run = store.load_run(run_bench(BenchOptions(pipeline="diffusion", configs=specs, repeat=1, warmup=0, size="test"),
                                       hw, store))
    by_name = {c["name"]: c["metrics"] for c in run["configs"]}
    # fp32 against itself is exact; bf16's noise predictions on fp32's latents are compared step by step.
    assert by_name["fp32"]["step_sqnr_db"] == float("inf") and by_name["fp32"]["psnr_db"] == float("inf")
    assert 15 < by_name["naive-bf16"]["step_sqnr_db"] < 45
    assert by_name["naive-bf16"]["step_sqnr_worst_db"] <= by_name["naive-bf16"]["step_sqnr_db"]
    assert "ssim" in by_name["naive-bf16"]


def test_config_names():
    hw = hardware.probe()
    with pytest.raises(UnknownConfigError, match="unknown configuration 'fsat' \\(did you mean 'fast'\\?\\); valid: fp32"):
        parse_configs("fp32,fsat", hw)
    specs, notes = parse_configs("fast", hw)
    assert [s.name for s in specs] == ["fp32", "fast"] and "fp32 added" in notes[0]
    specs, notes = parse_configs("fast,fp32,memory", hw)  # the reference runs first, whatever the order asked
    assert [s.name for s in specs] == ["fp32", "fast", "memory"] and "fp32 moved first" in notes[0]
    defaults, notes = default_configs(hw)
    names = [s.name for s in defaults]
    assert names[0] == "fp32" and "fast" in names
    if hw.dtypes["fp16"].emulated:
        assert "naive-fp16" not in names and any("naive-fp16 left out" in n for n in notes)
    assert ConfigSpec("x", "naive", "fp16").dtype == "fp16"


def test_unknown_pipeline_and_bad_flags_exit_2(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["bench", "--pipeline", "ttx", "--db", str(tmp_path / "x.sqlite")])
    assert result.exit_code == 2 and "did you mean 'tts'" in result.output.lower()
    result = runner.invoke(app, ["bench", "--pipeline", "tts", "--batch", "0", "--db", str(tmp_path / "x.sqlite")])
    assert result.exit_code == 2 and "--batch '0'" in result.output
    (tmp_path / "text.sqlite").write_text("hello")
    result = runner.invoke(app, ["bench", "--pipeline", "tts", "--size", "test", "--db", str(tmp_path / "text.sqlite")])
    assert result.exit_code == 2 and "not a SQLite database" in result.output
    assert (tmp_path / "text.sqlite").read_text() == "hello"


def test_a_run_is_complete_only_when_it_ran_to_its_end(tmp_path):
    hw = hardware.probe()
    specs, _ = parse_configs("fp32,memory", hw)
    options = BenchOptions(pipeline=SMALL, configs=specs, repeat=3, warmup=0, size="test")
    with Store(tmp_path / "b.sqlite") as store:
        # Cancelled after the first timed round: the configurations measured 1 of 3 runs.
        seen = []
        cancelled = run_bench(options, hw, store, progress=lambda d, n: seen.append(d),
                              should_stop=lambda: sum("run " in d for d in seen) >= 2)
        run = store.load_run(cancelled)
        assert run["status"] == "cancelled"
        assert {c["status"] for c in run["configs"]} == {"partial"}
        assert all("of 3 timed runs" in c["error"] for c in run["configs"])

        # A crash of the runner itself (here: in the progress callback) is never "complete".
        def explode(description, n):
            if "run " in description:
                raise OverflowError("cannot convert float infinity to integer")

        with pytest.raises(OverflowError):
            run_bench(options, hw, store, progress=explode)
        (crashed,) = [r for r in store.runs(10) if r["id"] != cancelled]
        crashed_run = store.load_run(crashed["id"])
        assert crashed_run["status"] == "failed"
        assert any("runner failed: OverflowError" in n for n in crashed_run["notes"])
        assert {c["status"] for c in crashed_run["configs"]} == {"partial"}

        # Ctrl-C after 2 of 3 timed rounds: incomplete, every configuration partial, the interrupt goes on.
        def interrupt(description, n, seen=[]):
            seen.append(description)
            if sum("run " in d for d in seen) >= 4:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            run_bench(options, hw, store, progress=interrupt)
        interrupted = store.load_run(max(r["id"] for r in store.runs(10)))
        assert interrupted["status"] == "incomplete"
        assert [c["status"] for c in interrupted["configs"]] == ["partial", "partial"]
        assert all("stopped after 2 of 3 timed runs" in c["error"] for c in interrupted["configs"])


def test_bench_refuses_a_timeout_that_is_not_finite(tmp_path):
    runner = CliRunner()
    for value in ("inf", "nan", "-1"):
        result = runner.invoke(app, ["bench", "--pipeline", "minilm", "--size", "test", "--timeout", value,
                                     "--db", str(tmp_path / "t.sqlite")])
        assert result.exit_code == 2 and "must be a finite, positive number of seconds" in result.output
    assert not (tmp_path / "t.sqlite").exists()
