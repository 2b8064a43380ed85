"""A budget is a promise: the planner and the runner, on a scripted clock.

The workers here are scripted: each load and run advances a clock the test owns by a
duration the scenario gives (loads in parallel, as real workers do), so what the runner
decides depends on those durations only, never on this machine's load. The scenarios
cover quiet and loaded machines, fast and slow pipelines, estimates that are right and
configurations and loads that turn out far slower than the calibration suggested.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from mixprec.bench.configs import ConfigSpec
from mixprec.bench.plan import OTHER_CONFIG_COST, PLAN_MARGIN, Calibration, drop_order, loading_s, plan_runs
from mixprec.bench.runner import GRACE, BenchOptions, run_bench
from mixprec.bench.store import Store
from mixprec.device.hardware import DtypeSpeed, Hardware
from mixprec.measure.executor import WorkerTimeout

CONFIGS = [ConfigSpec("fp32", "baseline"), ConfigSpec("matmul-medium", "matmul", "medium"),
           ConfigSpec("autocast-bf16", "autocast", "bf16"), ConfigSpec("naive-bf16", "naive", "bf16"),
           ConfigSpec("naive-fp16", "naive", "fp16"), ConfigSpec("quality", "preset", "quality"),
           ConfigSpec("balanced", "preset", "balanced"), ConfigSpec("fast", "preset", "fast"),
           ConfigSpec("memory", "preset", "memory")]


def _hardware() -> Hardware:
    speeds = {name: DtypeSpeed(name, True, 100.0, 1.0, "fast") for name in ("fp32", "bf16", "fp16")}
    return Hardware("cpu", "scripted CPU", None, 1 << 34, (), 2, torch.__version__, speeds)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ScriptedWorker:
    """Answers like a bench worker; every answer costs scripted seconds on the clock."""

    def __init__(self, clock: Clock, job: dict, world: "World"):
        self.clock, self.world, self.name = clock, world, job["spec"]["name"]
        self.steps = int(job["overrides"].get("steps", world.steps))
        self.ready_at = clock.now + world.load_s(self.name)
        self.closed = False

    def _spend(self, seconds: float, timeout: float | None) -> None:
        if timeout is not None and seconds > timeout:
            self.clock.now += timeout
            raise WorkerTimeout(f"no answer within {timeout:.0f} s")
        self.clock.now += seconds

    def wait_ready(self, timeout: float | None) -> dict:
        self._spend(max(0.0, self.ready_at - self.clock.now), timeout)
        return {"weight_bytes": 1 << 20, "policy": None, "pid": 1, "output_kind": "embedding", "load_cpu_s": self.world.load_cpu,
                "work": ("steps", self.steps, 2)}

    def request(self, command: str, payload=None, *, timeout: float | None = None) -> dict:
        assert not self.closed, f"{self.name}: request after close"
        if command == "run":
            seconds = self.world.run_s(self.name) * self.steps / self.world.steps
            self._spend(seconds, timeout)
            out = {"seconds": seconds, "fallbacks": 0}
            if payload and payload.get("want_output"):
                out["output"], out["extras"] = torch.ones(1, 4), {}
            return out
        if command == "reference":
            return {"compile_seconds": None}
        return {"peak_mem_bytes": 0, "weight_bytes": 1 << 20, "fallbacks": 0}

    def close(self) -> None:
        self.closed = True


class World:
    """A machine as the scenario has it: the reference's load and run, and how much slower the rest really are."""

    def __init__(self, clock: Clock, *, load: float, run: float, slower: float, busy: int, steps: int = 10):
        self.clock, self.load, self.run, self.slower, self.busy, self.steps = clock, load, run, slower, busy, steps
        self.load_cpu = load / (1 + busy / 2)  # what one load costs in CPU seconds when it gets its share of 2 cores
        self.started = 0

    def load_s(self, name: str) -> float:
        self.started += 1
        if name == "fp32" and self.started == 1:
            return self.load
        # The other workers load at once and share the cores with ``busy`` other processes,
        # ``slower`` times worse than the share model says (memory, disk, a heavier config).
        return self.load * self.slower * (1 + self.started / 4)

    def run_s(self, name: str) -> float:
        return self.run if name == "fp32" else self.run * OTHER_CONFIG_COST * self.slower


class ScriptedExecutor:
    def __init__(self, world: World):
        self.world = world

    def start(self, serve, job):
        return ScriptedWorker(self.world.clock, job, self.world)


SCENARIOS = list(itertools.product(
    (0.05, 0.6, 4.0, 25.0),   # seconds of the reference's run
    (2.0, 12.0, 40.0),        # seconds of its load
    (1.0, 2.5),               # how much slower than planned the rest really are
    (0, 6),                   # other runnable processes
    (90.0, 280.0),            # the budget
))


class TestTheBudgetIsKept:
    @pytest.mark.parametrize("run, load, slower, busy, budget", SCENARIOS)
    def test_a_run_ends_within_its_budget_and_says_what_it_left_out(self, tmp_path, run, load, slower, busy, budget):
        clock = Clock()
        world = World(clock, load=load, run=run, slower=slower, busy=busy)
        began = clock.now
        with Store(tmp_path / "b.sqlite") as store:
            run_id = run_bench(BenchOptions(pipeline="scripted", configs=CONFIGS, repeat=5, warmup=1, budget=budget,
                                            cores=2, clock=clock), _hardware(), store, executor=ScriptedExecutor(world))
            stored = store.load_run(run_id)
        spent = clock.now - began
        # The reference's own load and calibration run are never cut: what the budget can keep
        # is everything after them.
        floor = load + run
        assert spent <= max(budget, floor) * (1 + GRACE) + 1e-6, stored["notes"]
        assert stored["status"] == "complete"
        by_name = {c["name"]: c for c in stored["configs"]}
        assert set(by_name) == {c.name for c in CONFIGS}  # every configuration is stored, measured or not
        skipped: dict[str, list[str]] = {}  # why -> the configurations left out for it
        for config in stored["configs"]:
            if config["status"] == "skipped":
                skipped.setdefault(config["error"], []).append(config["name"])
        for why, names in skipped.items():  # one note per reason: the first five named, the rest counted
            (note,) = [n for n in stored["notes"] if n.endswith(" " + why)]
            assert all(name in note for name in names[:5]) and (len(names) > 5) is (f"and {len(names) - 5:,} more" in note)
        for config in stored["configs"]:
            if config["status"] == "skipped":
                assert config["error"].startswith("not measured: ") and not config["samples"]
            elif config["status"] == "ok":
                assert config["samples"]
            else:
                assert config["status"] == "partial" and config["error"]
        if spent > budget * PLAN_MARGIN or any(c["status"] != "ok" for c in stored["configs"]):
            assert any("budget" in note for note in stored["notes"])

    @staticmethod
    def _bench(tmp_path, budget: float, **world: float) -> tuple[Clock, dict]:
        clock = Clock()
        with Store(tmp_path / "b.sqlite") as store:
            return clock, store.load_run(run_bench(BenchOptions(pipeline="scripted", configs=CONFIGS, repeat=3, warmup=1,
                                                         budget=budget, cores=2, clock=clock), _hardware(), store,
                                            executor=ScriptedExecutor(World(clock, busy=0, **world))))

    def test_a_quiet_fast_machine_gets_what_was_asked(self, tmp_path):
        _, run = self._bench(tmp_path, 280, load=2.0, run=0.05, slower=1.0)
        assert all(c["status"] == "ok" and len(c["samples"]) >= 3 for c in run["configs"])
        assert any("as asked" in note for note in run["notes"])

    def test_configurations_far_slower_than_planned_are_stopped_and_stored_as_not_measured(self, tmp_path):
        clock, run = self._bench(tmp_path, 120, load=5.0, run=4.0, slower=6.0)
        skipped = [c for c in run["configs"] if c["status"] == "skipped"]
        assert skipped and all("not measured" in c["error"] for c in skipped)
        assert any("time budget" in c["error"] for c in skipped)
        assert clock.now - 1000.0 <= 120 * (1 + GRACE)


    def test_a_slow_pipeline_gets_fewer_steps_and_the_reference_is_run_again_at_them(self, tmp_path):
        clock = Clock()
        world = World(clock, load=1.0, run=10.0, slower=1.0, busy=0)
        plans = []
        with Store(tmp_path / "b.sqlite") as store:
            run = store.load_run(run_bench(BenchOptions(pipeline="scripted", configs=CONFIGS[:3], repeat=3, warmup=1,
                                                        budget=60, cores=2, clock=clock,
                                                        on_plan=lambda batch, plan: plans.append(plan)),
                                           _hardware(), store, executor=ScriptedExecutor(world)))
        assert 2 <= plans[0].work["steps"] < 10 and "steps 10 -> " in plans[0].reason
        assert run["size"] == f"default (steps={plans[0].work['steps']})"
        assert world.started == 4  # the reference twice, then the two others
        assert all(c["status"] == "ok" and len(c["samples"]) >= 1 for c in run["configs"])
        assert clock.now - 1000.0 <= 60 * (1 + GRACE)


class TestThePlan:
    @pytest.mark.parametrize("run, load, busy, budget, n, cores", list(itertools.product(
        (0.01, 0.5, 3.0, 30.0, 200.0), (0.5, 8.0, 60.0), (0, 2, 10), (30.0, 90.0, 420.0), (2, 5, 11), (2, 8))))
    def test_the_estimate_fits_the_budget_unless_fp32_alone_cannot(self, run, load, busy, budget, n, cores):
        cal = Calibration(load_s=load, run_s=run, work=("steps", 20), work_min=2, load_cpu_s=load / (1 + busy / cores),
                          busy=busy)
        costs = [1.0] + [OTHER_CONFIG_COST] * (n - 1)
        plan = plan_runs(cal, costs, budget_s=budget, max_warmup=1, max_repeat=5, cores=cores)
        assert 1 <= plan.repeat <= 5 and 0 <= plan.warmup <= 1 and 0 not in plan.dropped
        alone = plan_runs(cal, [1.0], budget_s=budget, max_warmup=0, max_repeat=1, cores=cores)
        if alone.estimate_s <= budget * PLAN_MARGIN:
            assert plan.estimate_s <= budget * PLAN_MARGIN, plan.reason
        else:
            assert "over the budget with fp32 alone" in plan.reason and len(plan.dropped) == n - 1
        if plan.dropped:
            assert f"{len(plan.dropped)} of {n} configurations left out" in plan.reason
            assert plan.work.get("steps", 20) == 2 or "steps" not in plan.work  # steps went down as far as they could first

    @pytest.mark.parametrize("busy, cores", [(0, 2), (2, 2), (6, 2), (14, 2), (0, 16), (30, 16)])
    def test_loading_slows_in_proportion_to_the_other_work(self, busy, cores):
        cal = Calibration(load_s=10.0, run_s=1.0, load_cpu_s=4.0, busy=busy)
        quiet = Calibration(load_s=10.0, run_s=1.0, load_cpu_s=4.0, busy=0)
        assert loading_s(cal, 0, cores) == 0.0
        assert loading_s(cal, 8, cores) >= loading_s(quiet, 8, cores) >= 10.0 * math.ceil(8 / cores)
        assert loading_s(cal, 8, cores) >= 4.0 * (busy + 8) / cores

    def test_the_costliest_alternatives_go_first_and_fp32_never(self):
        costs = [1.0, 1.3, 16.0, 1.3, 1.3]
        assert drop_order(costs, [False, False, False, True, False]) == [2, 4, 1, 3]
