"""A long tune says what it does, how far it is and about how long is left, from its first
second: events in order, estimates computed from the durations measured on its clock (a
clock the model's runs move, so nothing here depends on how fast this machine is)."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import pytest

from mixprec.diagnose.progress import ProfileProgress
from mixprec.tuning.evaluators import InProcessEvaluator
from mixprec.tuning.progress import TuneMeter, TuneProgress
from mixprec.tuning.tuner import stderr_progress, tune

from tune_models import inputs as _inputs, small as synthetic_model

#: A factory whose worker imports nothing beyond torch and mixprec (tests/small_factory.py): what is said
#: while a worker starts does not depend on the model it builds.
SMALL = f"{Path(__file__).parents[1] / 'small_factory.py'}:build"

#: Seconds every run of the model takes on the scripted clock.
RUN_S = 2.0


class RunClock:
    """A clock that only the model's runs move: each run takes :data:`RUN_S` seconds."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _timed_model(clock: RunClock, kind: str = "layer"):
    model = synthetic_model(kind)

    def run(x):
        clock.now += RUN_S
        return model(x)

    return model, run


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _measurements(events: list[TuneProgress]) -> dict[int, list[TuneProgress]]:
    """Candidate index -> the work events of its measurement, in order."""
    out: dict[int, list[TuneProgress]] = {}
    for event in events:
        if event.work is not None and event.work.phase.startswith("measuring #"):
            index = int(event.work.phase.split("#")[1].split()[0])
            out.setdefault(index, []).append(event)
    return out


class TestTuneProgress:
    @pytest.mark.parametrize("seeds, repeat, budget", [((0,), 1, 12), ((0, 1), 2, 14), ((0, 1), 3, None)])
    def test_each_evaluation_reports_its_runs_and_its_estimate_comes_from_measured_runs(self, seeds, repeat, budget):
        clock = RunClock()
        model, run = _timed_model(clock)
        evaluator = InProcessEvaluator(model, _inputs, run, seeds=seeds, repeat=repeat, name=f"progress-{len(seeds)}-{repeat}")
        events: list[TuneProgress] = []
        began = clock.now  # after the evaluator's fp32 references
        result = tune("synthetic", "sqnr>=30", evaluator=evaluator, dtypes=("bf16",), budget=budget, local_search=False,
                      final_rounds=0, validation_seeds=0, progress=events.append, clock=clock)
        assert evaluator.progress is None  # the tune run's callback was taken off the evaluator again
        runs = len(seeds) + repeat
        measured = _measurements(events)
        candidates = [e for e in events if e.work is None]
        assert [e.latest.index for e in candidates] == [c.index for c in result.path]
        assert sorted(measured) == [c.index for c in result.path if not c.cached]
        for index, mine in measured.items():
            # the evaluation begins, then counts its runs one by one to its total
            assert [e.work.done for e in mine][-runs - 1:] == list(range(runs + 1))
            assert {e.work.total for e in mine if e.work.done} == {runs} and mine[-1].work.unit == "runs"
            for event in mine:
                if event.work.done:  # the rate measured so far: RUN_S a run
                    assert event.work.left_s == pytest.approx(RUN_S * (runs - event.work.done))
                elif index > 0:  # before its first run: the mean run measured earlier, times its runs
                    assert event.work.left_s == pytest.approx(RUN_S * runs)
            following = events[events.index(mine[-1]) + 1]
            assert following.work is None and following.latest.index == index
            assert following.evaluations == sorted(measured).index(index) + 1
        # the search's estimate: the evaluations the budget has left, each as long as the measured ones
        for event in candidates:
            expected = None if budget is None else (budget - event.evaluations) * RUN_S * runs
            assert event.left_s == (pytest.approx(expected) if expected is not None else None)
        assert [e.elapsed_s for e in events] == sorted(e.elapsed_s for e in events)
        assert events[-1].elapsed_s == pytest.approx(clock.now - began)

    @pytest.mark.parametrize("rounds", [1, 2])
    def test_profile_validation_and_final_retiming_each_say_what_runs(self, rounds):
        clock = RunClock()
        model, run = _timed_model(clock)
        evaluator = InProcessEvaluator(model, _inputs, run, seeds=(0, 1), repeat=1, name="progress-steps")
        events: list[TuneProgress] = []
        tune("synthetic", "sqnr>=30", evaluator=evaluator, dtypes=("bf16",), budget=30, local_search=False,
             final_rounds=rounds, validation_seeds=2, progress=events.append, clock=clock)
        phases = list(dict.fromkeys(e.work.phase for e in events if e.work is not None))
        profiling = [p for p in phases if p.startswith("profiling #1 all-bf16")]
        assert profiling and any(p.endswith("pass under the policy") for p in profiling)
        assert {e.work.unit for e in events if e.work is not None and e.work.phase in profiling[1:]} == {"module calls"}
        assert phases.index(profiling[0]) > phases.index("measuring #1 all-bf16")
        retiming = [e for e in events if e.work is not None and e.work.phase.startswith("re-timing")]
        finalists = int(retiming[0].work.phase.split()[1])
        assert [e.work.done for e in retiming] == list(range((rounds + 1) * finalists + 1))
        validating = [e for e in events if e.work is not None and e.work.phase.startswith("validating #")]
        assert validating and events.index(validating[0]) > events.index(retiming[-1])
        first = [e.work for e in validating if e.work.phase == validating[0].work.phase]
        # two new seeds: their fp32 references, then the policy on them
        assert [w.done for w in first][-5:] == [0, 1, 2, 3, 4] and first[-1].total == 4
        assert first[-1].left_s == pytest.approx(0.0)

    def test_the_first_event_comes_before_the_worker_is_built_and_the_reference_counts_its_runs(self):
        events: list[TuneProgress] = []
        tune(SMALL, "sqnr>=30", size="test", seeds=(0, 1), repeat=1, presets=[], local_search=False,
             final_rounds=0, validation_seeds=0, dtypes=("bf16",), progress=events.append)
        first = events[0]
        assert first.work.phase == f"starting a worker and building the {SMALL} pipeline (test size)"
        assert first.latest is None and first.evaluations == 0 and first.work.left_s is None
        reference = [e.work for e in events if e.work is not None and e.work.phase == "fp32 reference"]
        assert [w.done for w in reference] == [0, 1, 2] and {w.total for w in reference} == {2}
        assert reference[1].left_s is not None  # one run measured: the other is estimated from it
        baseline = _measurements(events)[0]
        assert [e.work.done for e in baseline] == [0, 0, 1, 2, 3] and baseline[0].work.left_s is not None
        assert events.index(baseline[0]) > events.index(next(e for e in events if e.work is not None and e.work.phase == "fp32 reference" and e.work.done == 2))


class TestTuneMeter:
    @pytest.mark.parametrize("durations", [[1.0, 1.0, 1.0], [4.0, 1.0], [0.5, 3.0, 2.5, 10.0]])
    def test_the_step_estimate_follows_the_measured_rate_and_the_search_estimate_the_mean_evaluation(self, durations):
        now = [0.0]
        events: list[TuneProgress] = []
        meter = TuneMeter(events.append, budget=10, clock=lambda: now[0], runs_per_evaluation=len(durations))
        meter.begin("building")
        assert events[-1].work.left_s is None and events[-1].left_s is None  # nothing measured yet
        meter.evaluating(0, "baseline fp32")
        meter.worker({"phase": None, "done": 0, "total": len(durations), "unit": "runs"})
        for done, seconds in enumerate(durations, 1):
            now[0] += seconds
            meter.worker({"phase": None, "done": done, "total": len(durations), "unit": "runs"})
            rate = sum(durations[:done]) / done
            assert events[-1].work.left_s == pytest.approx(rate * (len(durations) - done))
            # the search: this evaluation's rest, then 9 more, each estimated from the runs measured so far
            assert events[-1].left_s == pytest.approx(rate * (len(durations) - done) + 9 * rate * len(durations))
        meter.evaluated()
        meter.evaluating(1, "all-bf16")  # before its first run: the mean run so far times its runs
        assert events[-1].work.left_s == pytest.approx(sum(durations))
        # no search counts evaluations here: 9 left after this one, each as long as the one measured
        assert events[-1].left_s == pytest.approx(sum(durations) + 9 * sum(durations))

    def test_a_step_the_tuner_counts_ignores_the_runs_the_evaluator_reports(self):
        now = [0.0]
        events: list[TuneProgress] = []
        meter = TuneMeter(events.append, clock=lambda: now[0])
        meter.begin("re-timing 2 finalists side by side", 4)
        for _ in range(4):
            meter.worker({"phase": None, "done": 0, "total": 1, "unit": "runs"})
            now[0] += 3.0
            meter.worker({"phase": None, "done": 1, "total": 1, "unit": "runs"})
            meter.tick()
        assert [e.work.done for e in events] == [0, 1, 2, 3, 4] and {e.work.total for e in events} == {4}
        assert events[2].work.left_s == pytest.approx(6.0) and events[-1].work.left_s == pytest.approx(0.0)
        assert "re-timing 2 finalists side by side: 2/4 runs (50%), about 6 s left" in events[2].text()


class TestStderrProgress:
    @pytest.mark.parametrize("interval", [5.0, 30.0])
    def test_the_first_line_at_once_a_line_per_candidate_and_work_lines_at_most_every_interval(self, interval):
        clock = RunClock()
        model, run = _timed_model(clock)
        evaluator = InProcessEvaluator(model, _inputs, run, seeds=(0,), repeat=1, name="stderr")
        out = io.StringIO()
        report = stderr_progress(interval, clock=clock, file=out)
        events: list[TuneProgress] = []

        def both(event: TuneProgress) -> None:
            events.append(event)
            report(event)

        tune("synthetic", "sqnr>=30", evaluator=evaluator, dtypes=("bf16",), budget=12, local_search=False,
             final_rounds=0, validation_seeds=0, progress=both, clock=clock)
        lines = out.getvalue().splitlines()
        assert all(line.startswith("mixprec tune: ") for line in lines)
        assert lines[0] == f"mixprec tune: {events[0].text()}"  # the first event is printed as it comes
        printed = []
        last = -float("inf")
        for event in events:
            if event.work is None or event.elapsed_s - last >= interval:
                last = event.elapsed_s
                printed.append(f"mixprec tune: {event.text()}")
        assert lines == printed


class TestProgressText:
    @pytest.mark.parametrize("total, done, unit, left, text", [
        (0, 0, "runs", None, "starting a worker"),
        (0, 0, "runs", 75.0, "starting a worker, about 1 min 15 s left"),
        (5, 2, "runs", 12.4, "starting a worker: 2/5 runs (40%), about 12 s left"),
        (400, 400, "module calls", 0.0, "starting a worker: 400/400 module calls (100%), about 0 s left"),
    ])
    def test_a_step_reads_what_it_does_how_far_and_what_is_left(self, total, done, unit, left, text):
        assert ProfileProgress("starting a worker", done, total, 1.0, left, unit).text() == text
