"""Round keeping and paired speed figures of a benchmark run."""

from __future__ import annotations

from typer.testing import CliRunner

from mixprec.bench.rounds import RoundKeeper, paired, speed_metrics, unsettled
from mixprec.bench.store import Store
from mixprec.bench.table import render_table_rows
from mixprec.cli import app
from mixprec.measure.stats import Ratio, instability, memory_beyond_noise, paired_ratio


def test_paired_ratio_pairs_rounds_and_is_robust_to_a_noisy_round():
    ref = [1.0, 1.1, 0.9, 1.0, 5.0, 1.05, 0.95, 1.0]  # round 5: the machine got busy for both
    cand = [0.5, 0.55, 0.45, 0.5, 2.5, 0.52, 0.47, 0.5]
    ratio = paired_ratio(ref, cand)
    assert 1.9 < ratio.low <= ratio.value <= ratio.high < 2.2 and ratio.verdict() == "above"
    # Unpaired medians would see the same figure only by luck; rounds missing on one side are dropped.
    assert paired(([0, 1, 2, 3, 4], ref[:5]), ([0, 2, 4], [0.5, 0.45, 2.5])).n == 3


def test_a_noisy_measurement_is_undecided_not_a_winner():
    ref = [1.0, 0.3, 2.0, 0.5, 1.5, 0.8, 1.2]
    cand = [0.6, 0.9, 1.0, 0.7, 2.1, 0.5, 1.3]  # per-round ratios scatter on both sides of 1
    ratio = paired_ratio(ref, cand)
    assert ratio.low < 1 < ratio.high and ratio.verdict() == "undecided"
    assert Ratio(1.5, 1.4, 1.6, 2).verdict() == "undecided"  # too few rounds to decide anything


def test_instability_and_memory_noise():
    assert instability([1.0, 1.01, 0.99, 1.0]) is None
    assert "CV" in instability([0.04, 2.5, 0.3, 1.0])
    assert "calibration 3.23 s vs 13 to 31 s" in instability([13, 31, 20], calibration=3.23)
    assert not memory_beyond_noise(36.2 * 2**20, 36.21 * 2**20, 0.0)  # RSS noise under the floor
    assert memory_beyond_noise(36 * 2**20, 80 * 2**20, 0.1)


class _Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def test_the_keeper_cuts_warm_ups_then_rounds_then_configurations_and_adds_rounds_while_ratios_are_wide():
    clock = _Clock()
    keeper = RoundKeeper(warmup=2, repeat=5, deadline=clock.now + 80, batch=1, clock=clock)
    keeper._last = 30.0  # a round takes 30 s: 7 rounds do not fit in 80 s
    assert keeper.go_on(0, list, list) == (True, [])
    assert keeper.go_on(1, list, list) == (True, []) and keeper.warmup == 1  # the second warm-up is cut first
    assert "1 warm-up round(s) left out" in keeper.notes[-1]
    clock.now += 30
    assert keeper.go_on(2, list, list) == (True, [])  # one more timed round still fits
    clock.now += 30
    assert keeper.go_on(3, list, list) == (False, [])  # after 2 timed rounds none fits: the rest are cut
    assert "3 of 5 planned timed round(s) dropped after 2" in keeper.notes[-1]

    # Not even one round fits before any was timed: the slowest configurations go, one always stays.
    keeper = RoundKeeper(warmup=1, repeat=3, deadline=clock.now + 40, batch=1, clock=clock)
    keeper._last = 60.0
    slow = lambda: [("slow", "slot-slow", 30.0), ("mid", "slot-mid", 20.0), ("fast", "slot-fast", 5.0)]  # noqa: E731
    go, dropped = keeper.go_on(1, list, slow)
    assert go and dropped == ["slot-slow"] and "dropped slow before its first timed run" in keeper.notes[-1]
    keeper._last = 500.0
    assert keeper.go_on(1, list, slow)[1] == ["slot-slow", "slot-mid"]  # "fast" stays

    wide = lambda: [("fast", Ratio(1.05, 0.8, 1.3, 5))]  # noqa: E731
    keeper = RoundKeeper(warmup=0, repeat=3, deadline=clock.now + 1000, batch=2, clock=clock)
    keeper._last = 0.01
    assert keeper.go_on(3, wide, list)[0] and keeper.go_on(5, wide, list)[0]  # adaptive rounds, up to 3 more
    assert keeper.go_on(6, wide, list) == (False, [])
    assert "batch 2: undecided after 6 timed rounds" in keeper.notes[-1] and "fast 1.05x (0.80-1.30)" in keeper.notes[-1]
    keeper = RoundKeeper(warmup=0, repeat=3, deadline=clock.now + 10, batch=2, clock=clock)
    keeper._last = 20.0
    assert keeper.go_on(3, wide, list) == (False, [])  # no room for an adaptive round
    assert RoundKeeper(0, 3, None, 1).go_on(3, wide, list)[0] is False  # without a budget, no rounds are added
    # Two planned rounds cut by the budget may still grow to the five pairs an interval needs, not just to four.
    keeper = RoundKeeper(warmup=1, repeat=2, deadline=clock.now + 1000, batch=1, clock=clock)
    keeper._last = 0.01
    assert keeper.extra == 3 and keeper.go_on(5, wide, list)[0] and keeper.go_on(6, wide, list)[0] is False


def test_speed_metrics_and_the_table_show_the_interval_and_doubts():
    metrics = speed_metrics(Ratio(0.98, 0.9, 1.07, 8), [1.0, 3.0, 0.5], instability([1.0, 3.0, 0.5]))
    assert metrics["speedup_ci_low"] == 0.9 and metrics["unstable"] == 1.0 and metrics["latency_cv"] > 0.5
    run = {"configs": [{"name": "fp32", "batch": 1, "status": "ok", "samples": [1.0, 1.0, 1.0], "metrics": {}},
                       {"name": "fast", "batch": 1, "status": "ok", "samples": [1.0, 3.0, 0.5],
                        "metrics": {**metrics, "latency_median": 1.0}}]}
    assert [r["speedup"] for r in render_table_rows(run)] == ["reference", "unstable (0.90–1.07)"]


def test_bench_stores_paired_intervals(tmp_path):
    db = tmp_path / "b.sqlite"
    result = CliRunner().invoke(app, ["bench", "--pipeline", "minilm", "--size", "test", "--configs", "fp32,fast",
                                      "--repeat", "6", "--warmup", "1", "--db", str(db)])
    assert result.exit_code == 0, result.output
    run = Store(db).load_run(1)
    fp32, fast = run["configs"]
    assert fp32["metrics"]["speedup"] == 1.0 and fast["metrics"]["speedup_pairs"] == 6
    m = fast["metrics"]
    assert m["speedup_ci_low"] <= m["speedup"] <= m["speedup_ci_high"]
    assert [s for s in fast["samples"]] and len(fast["samples"]) == 6


def test_a_ratio_asks_for_rounds_until_it_has_a_narrow_95_percent_interval():
    # Three rounds all faster give only their range (one time in eight by chance): within a budget,
    # the adaptive rounds go on to the five pairs a bootstrap interval needs.
    assert unsettled(Ratio(1.87, 1.80, 1.91, 3, exact=False))
    assert unsettled(Ratio(1.2, 1.1, 1.3, 2, exact=False))  # too few pairs
    assert unsettled(Ratio(1.5, 1.2, 1.8, 6))  # an interval wider than the target
    assert not unsettled(Ratio(1.87, 1.82, 1.90, 5))


def test_other_jobs_are_counted_and_said_but_idle_workers_are_not(tmp_path, monkeypatch):
    from mixprec.bench import rounds
    from mixprec.bench.rounds import load_note, runnable_others

    assert load_note([3, 2, 3], cores=2).startswith("the machine was loaded: a median of 3 other runnable processes on 2 cores")
    assert load_note([0, 1, 0], cores=2) is None and load_note([], cores=2) is None
    # The kernel's count of processes ready to run (procs_running) counts jobs that compete
    # for the cores, not sleeping ones (workers waiting for a request); the count is read
    # from a file written here, so the machine's real load never enters the test.
    stat = tmp_path / "stat"
    monkeypatch.setattr(rounds, "PROC_STAT", str(stat))

    def kernel_says(running: int) -> None:
        stat.write_text(f"cpu  1 2 3 4\nctxt 99\nprocs_running {running}\nprocs_blocked 0\n", encoding="ascii")

    keeper = RoundKeeper(warmup=0, repeat=3, deadline=None, batch=1)
    kernel_says(1)  # only the benchmark itself: idle workers are not runnable
    keeper.start_round()
    assert runnable_others() == 0
    kernel_says(3)
    keeper.start_round()
    keeper.start_round()
    assert keeper.busy == [0, 2, 2] and load_note(keeper.busy, cores=2).startswith("the machine was loaded: a median of 2")
    assert load_note(keeper.busy, cores=4) is None
    stat.write_text("cpu  1 2 3 4\n", encoding="ascii")
    assert runnable_others() is None  # a kernel that does not say
    stat.unlink()
    keeper.start_round()
    assert runnable_others() is None and keeper.busy == [0, 2, 2]  # no /proc: nothing sampled, nothing said
