"""Fitting a benchmark into a time budget: the planner, and real runs that follow it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mixprec import hardware
from mixprec.bench.configs import parse_configs
from mixprec.bench.plan import Calibration, batch_limit, config_cost, parse_budget, plan_runs
from mixprec.bench.runner import BenchOptions, run_bench
from mixprec.bench.store import Store
from mixprec.cli import app

FACTORY = f"{Path(__file__).with_name('budget_factory.py')}:pipeline"
#: A pipeline whose workers load in no time beyond torch's import (tests/small_factory.py): for
#: what the command says and refuses, not for what a model computes.
SMALL = f"{Path(__file__).parents[1] / 'small_factory.py'}:build"


@pytest.mark.parametrize("text, seconds", [("420", 420), ("420s", 420), ("7m", 420), ("6m30s", 390), ("1h", 3600),
                                           ("0.5m", 30)])
def test_budget_durations(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5", "7x", "m", "nan", "inf", "1e999", "7 minutes"])
def test_bad_budgets_name_the_flag_and_the_forms(text):
    with pytest.raises(ValueError, match=r"--budget .*expected a positive duration such as 420, 420s, 7m"):
        parse_budget(text)


def test_the_plan_takes_what_was_asked_when_it_fits():
    cal = Calibration(load_s=5.0, run_s=1.0)
    plan = plan_runs(cal, [1.0, 1.3, 1.3], budget_s=600, max_warmup=1, max_repeat=3, cores=2)
    assert (plan.warmup, plan.repeat, plan.work) == (1, 3, {})
    assert "as asked" in plan.reason and "fp32 reference 1.00 s per run" in plan.reason


def test_the_plan_lowers_timed_runs_then_warm_up_to_fit():
    cal = Calibration(load_s=5.0, run_s=2.0)
    costs = [1.0] + [1.3] * 5  # 15 s a round; the other 5 workers load 3 at a time: 15 s
    rich = plan_runs(cal, costs, budget_s=90, max_warmup=1, max_repeat=5, cores=2)
    assert (rich.warmup, rich.repeat) == (1, 3) and rich.estimate_s == pytest.approx(75)
    assert "the asked 1 warm-up + 5 timed runs would take about 105 s" in rich.reason
    spread = plan_runs(cal, costs, budget_s=60, max_warmup=1, max_repeat=5, cores=2)
    assert (spread.warmup, spread.repeat) == (0, 2)  # 15 + 2 x 15 + the reference's extra 2 s
    lean = plan_runs(cal, costs, budget_s=40, max_warmup=1, max_repeat=5, cores=2)
    assert (lean.warmup, lean.repeat) == (0, 1) and "1 timed run per configuration" in lean.reason
    assert lean.estimate_s <= 40


def test_the_plan_shortens_the_work_option_when_one_run_does_not_fit():
    cal = Calibration(load_s=2.0, run_s=10.0, work=("steps", 10), work_min=2)
    plan = plan_runs(cal, [1.0, 1.3, 1.3], budget_s=30, max_warmup=1, max_repeat=3, cores=2)
    assert (plan.warmup, plan.repeat) == (0, 1)
    assert 2 <= plan.work["steps"] < 10 and plan.estimate_s <= 30
    assert "steps 10 -> " in plan.reason
    floor = plan_runs(cal, [1.0, 1.3, 1.3], budget_s=1, max_warmup=1, max_repeat=3, cores=2)
    assert floor.work == {"steps": 2} and "over the budget" in floor.reason
    fixed = plan_runs(Calibration(load_s=2.0, run_s=10.0), [1.0, 1.3], budget_s=1, max_warmup=1, max_repeat=3)
    assert fixed.work == {} and "no work option" in fixed.reason


def test_an_emulated_dtype_costs_what_the_probe_measured(bf16_cpu):
    hw = hardware.probe()
    specs = {s.name: s for s in parse_configs("fp32,fast,naive-fp16", hw)[0]}
    assert config_cost(specs["fp32"], hw) == 1.0
    assert config_cost(specs["fast"], hw) == pytest.approx(1.3)
    fp16 = hw.dtypes["fp16"]
    if fp16.emulated:
        assert config_cost(specs["naive-fp16"], hw) == pytest.approx(max(1.3, 1 / fp16.ratio))


def test_the_batch_limit_follows_weights_per_item_memory_and_workers():
    cal = Calibration(load_s=1, run_s=1, weight_bytes=100 << 20, peak_bytes=10 << 20)
    assert batch_limit(cal, workers=4, available_bytes=4 * (100 + 50) << 20) == 5
    assert batch_limit(cal, workers=8, available_bytes=4 * (100 + 50) << 20) == 0
    tiny = Calibration(load_s=1, run_s=1, weight_bytes=0, peak_bytes=0)  # at least 1 MiB per item
    assert batch_limit(tiny, workers=1, available_bytes=64 << 20) == 64


def test_a_budget_nothing_fits_in_keeps_the_reference_and_stores_the_rest_as_not_measured(tmp_path):
    hw = hardware.probe()
    specs, _ = parse_configs("fp32,memory", hw)
    plans = []
    with Store(tmp_path / "b.sqlite") as store:
        run_id = run_bench(BenchOptions(pipeline=FACTORY, configs=specs, repeat=3, warmup=1, size="test", budget=0.5,
                                        on_plan=lambda batch, plan: plans.append(plan)), hw, store)
        run = store.load_run(run_id)
    assert [p.dropped for p in plans] == [[1]]  # loading a worker alone takes longer than 0.5 s
    assert run["status"] == "complete"
    fp32, memory = run["configs"]
    assert memory["status"] == "skipped" and memory["error"].startswith("not measured: the time budget left no room")
    assert not memory["samples"]
    assert any(note.startswith("batch 1: memory not measured: ") for note in run["notes"])


def test_cli_budget_prints_the_plan_and_a_huge_batch_is_refused_before_any_run(tmp_path):
    db = tmp_path / "b.sqlite"
    ok = CliRunner().invoke(app, ["bench", "--pipeline", SMALL, "--size", "test", "--configs", "fp32,memory",
                                  "--budget", "10m", "--repeat", "2", "--warmup", "1", "--db", str(db)])
    assert ok.exit_code == 0, ok.output
    said = " ".join(ok.output.split())  # the terminal's line breaks undone
    assert f"{SMALL}: batch 1: 1 warm-up + 2 timed runs per configuration" in said and "as asked" in said
    run = Store(db).load_run(1)
    counts = [len(c["samples"]) for c in run["configs"]]
    # Within the budget, rounds are added while a ratio has no 95% interval (fewer than five
    # pairs) or too wide a one, up to as many again as asked or to five pairs if that is more:
    # two pairs never decide, so rounds were added to five, and said.
    assert counts[0] == counts[1] == 5
    assert any(f"{counts[0] - 2} round(s) added" in note for note in run["notes"])
    for bad in (["--budget", "soon"], ["--budget", "0s"]):
        result = CliRunner().invoke(app, ["bench", "--pipeline", SMALL, "--size", "test", *bad, "--db", str(db)])
        assert result.exit_code == 2 and "--budget" in result.output
    huge = CliRunner().invoke(app, ["bench", "--pipeline", SMALL, "--size", "test", "--configs", "fp32,memory",
                                    "--batch", "1,1000000000", "--db", str(db)])
    assert huge.exit_code == 2, huge.output
    assert "--batch 1000000000: at most" in huge.output and "--force-batch" in huge.output
    assert len(Store(db).runs()) == 1  # nothing stored for the refused run
