"""Run a benchmark: every configuration in its own worker, repetitions interleaved.

For each batch size the fp32 worker runs first to produce the reference output (and,
for ``tts``, the speech tokens every other configuration is then teacher-forced on).
With a time budget that run is also the calibration the plan is made from
(:mod:`mixprec.bench.plan`), so the fp32 worker loads and runs alone and the others load
after it; without one, all workers load at once. Then warm-up rounds, then timed
rounds: each round runs every configuration once, so the noise of a shared machine
spreads over all of them. A configuration that raises, dies or exceeds its time limit
is recorded as failed or timed out and the run goes on.

With a budget the time is kept as the run goes, on :attr:`BenchOptions.clock`: after the
other workers have loaded the plan is made again from the time actually left (fewer
rounds, or configurations left out); before each call the configuration's last run time
says whether the call ends before the deadline, and one that would not is not made (a
configuration never timed is stored as ``skipped``, not measured, with the reason); a
call still running at the deadline (plus :data:`GRACE` of the budget) is stopped. A configuration cut short (the
run cancelled or interrupted) is ``partial``, never ``ok``; a run is ``complete`` only
when it ran to its end, and a crash of the runner itself stores it as ``failed``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from mixprec._quote import few
from mixprec.measure import metrics as bench_metrics
from mixprec.bench.configs import ConfigSpec
from mixprec.bench.plan import Calibration, Plan, config_cost, drop_order, plan_runs
from mixprec.bench.slots import LOAD_TIMEOUT_S, Slot, call, stop_for_budget, wait_ready
from mixprec.bench.against import fp8_against_16bit
from mixprec.bench.rounds import RoundKeeper, load_note, paired, runnable_others, speed_metrics, unsettled
from mixprec.bench.store import Store
from mixprec.bench.worker import job_for, serve
from mixprec.measure.executor import Executor, LocalProcessExecutor
from mixprec.measure.machine import machine_fingerprint, versions
from mixprec.measure.stats import instability
from mixprec.device.hardware import Hardware, contradiction, forget

__all__ = ["BenchOptions", "BenchCancelled", "BenchInterrupted", "run_bench", "calibrate", "size_label"]

#: Safety cap on the fp32 reference when no --timeout is given (it is never timed out otherwise).
REFERENCE_LIMIT_S = 3600.0
#: Without --timeout, a configuration may take this many times the reference's measured time ...
RELATIVE_LIMIT = 20.0
#: ... and at least this many seconds.
MIN_LIMIT_S = 30.0
#: With a budget, a call still running this fraction of the budget past the deadline is stopped.
GRACE = 0.05


@dataclass
class BenchOptions:
    """What to measure and how.

    Attributes:
        pipeline: registered pipeline name.
        configs: configurations (``fp32`` first).
        batches: batch sizes.
        repeat: timed runs per configuration and batch.
        warmup: untimed runs before them.
        timeout: seconds each configuration may spend in its runs (per batch size), the
            reference included; ``None`` (the default): the fp32 reference is not timed out
            (a one-hour safety cap) and every other configuration may take
            :data:`RELATIVE_LIMIT` times the reference's measured time, at least
            :data:`MIN_LIMIT_S`: a limit that follows the machine, not a constant.
        size: pipeline size (``default`` or ``test``).
        seed: seed of weights and inputs (identical in every worker).
        device: ``cpu`` or ``cuda``.
        notes: lines the report should carry (configurations left out, ...).
        budget: seconds the whole run may take (all batch sizes), or ``None``. With a
            budget, ``warmup`` and ``repeat`` are the most to make: after the fp32
            reference's first run (the calibration) :func:`mixprec.bench.plan.plan_runs`
            picks what fits, and may lower the pipeline's work option (see
            :attr:`mixprec.pipelines.Pipeline.work_option`); the choice is in the notes.
        overrides: pipeline options every worker builds the pipeline with.
        on_plan: called with ``(batch, plan)`` when a budget plan is made (again after
            the workers loaded, when the time left changes it); ``plan.reason`` is then the
            words of the run's note ``batch N: <reason>``.
        cores: how many workers load at once (for the plan's estimate).
        clock: monotonic seconds the budget is kept on (tests give a scripted clock).
    """

    pipeline: str
    configs: list[ConfigSpec]
    batches: list[int] = field(default_factory=lambda: [1])
    repeat: int = 3
    warmup: int = 1
    timeout: float | None = None
    size: str = "default"
    seed: int = 0
    device: str = "cpu"
    notes: list[str] = field(default_factory=list)
    command: str = ""
    budget: float | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    on_plan: Callable[[int, Plan], None] | None = None
    cores: int = field(default_factory=lambda: max(1, os.cpu_count() or 1))
    clock: Callable[[], float] = time.monotonic

    @property
    def size_label(self) -> str:
        return size_label(self.size, self.overrides)


def size_label(size: str, overrides: dict[str, Any]) -> str:
    """The size as a run stores it: ``default``, or ``default (steps=6)`` with overrides.

    Runs of different labels are never compared by ``gate`` or ``compare``.
    """
    if not overrides:
        return size
    return f"{size} ({', '.join(f'{k}={v}' for k, v in sorted(overrides.items()))})"


class BenchCancelled(Exception):
    """Raised between worker steps when ``should_stop()`` turns true; caught by :func:`run_bench`."""


class BenchInterrupted(KeyboardInterrupt):
    """The user's interrupt (Ctrl-C) during a benchmark, raised once its runs were stored as
    ``status`` (``incomplete``: :func:`run_bench`; ``cancelled``: each run of a hardware matrix);
    its message says so (a ``KeyboardInterrupt``, caught as one)."""

    def __init__(self, run_ids: Sequence[int], pipeline: str, status: str = "incomplete") -> None:
        runs = f"run {run_ids[0]}" if len(run_ids) == 1 else "runs " + ", ".join(map(str, run_ids))
        super().__init__(f"{runs} ({pipeline}) stored as {status}, with what was measured" if run_ids
                         else f"nothing of {pipeline} was stored")
        self.run_ids = list(run_ids)


def run_bench(
    options: BenchOptions,
    hardware: Hardware,
    store: Store,
    *,
    executor: Executor | None = None,
    progress: Callable[[str, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    node: dict[str, Any] | None = None,
) -> int:
    """Measure every configuration and batch size; returns the run id in ``store``.

    ``node`` describes where ``executor`` runs the workers when that is not this
    machine (see :func:`mixprec.measure.cluster.probe_group`): its ``versions`` are
    stored instead of this process's, and its ``node`` entry (label, host) with the
    machine; ``hardware`` must then be the probe measured there.

    ``progress(description, steps_done)`` is called after each worker step. When
    ``should_stop()`` turns true (checked after each step) the workers are stopped, what
    was measured is kept with metrics computed from it, and the run is stored as
    ``cancelled``. On ``KeyboardInterrupt`` the same happens, the run stays
    ``incomplete`` and the interrupt propagates as :class:`BenchInterrupted`.
    """
    executor = executor or LocalProcessExecutor()

    def step(description: str, n: int) -> None:
        if progress is not None:
            progress(description, n)
        if should_stop is not None and should_stop():
            raise BenchCancelled(description)

    machine = {**hardware.to_dict(), "device": options.device}  # the device the run asked for, e.g. cuda:1
    if node and node.get("node"):
        machine["node"] = node["node"]
    run_id = store.start_run(pipeline=options.pipeline, size=options.size_label, machine=machine,
                             fingerprint=machine_fingerprint(hardware),
                             versions=node["versions"] if node and node.get("versions") else versions(), notes=options.notes,
                             command=options.command)
    status, notes = "complete", list(options.notes)
    clock = options.clock
    deadline = clock() + options.budget if options.budget else None
    state = _RunState(dict(options.overrides))
    try:
        for index, batch in enumerate(options.batches):
            share = None if deadline is None else (deadline - clock()) / (len(options.batches) - index)
            notes += _run_batch(options, batch, hardware, store, run_id, executor, step, share, state)
    except BenchCancelled:
        status = "cancelled"
    except KeyboardInterrupt:
        status = "incomplete"
        raise BenchInterrupted([run_id], options.pipeline) from None
    except BaseException as exc:
        # A crash of the runner itself: never stored as complete.
        status = "failed"
        notes.append(f"the benchmark runner failed: {type(exc).__name__}: {exc}")
        raise
    finally:
        store.finish_run(run_id, status=status, notes=notes, size=size_label(options.size, state.overrides))
    return run_id


def calibrate(options: BenchOptions, hardware: Hardware, *, batch: int = 1, executor: Executor | None = None) -> Calibration:
    """Load the fp32 reference alone, run it once at ``batch`` and measure its memory.

    Used before a run starts, to bound ``--batch`` by what fits in memory.

    Raises:
        WorkerError, WorkerTimeout: the reference failed to load or run.
    """
    executor = executor or LocalProcessExecutor()
    worker = executor.start(serve, job_for(options.configs[0], pipeline=options.pipeline, size=options.size, seed=options.seed,
                                    batch=batch, hardware=hardware, device=options.device, overrides=options.overrides))
    try:
        start = time.perf_counter()
        ready = worker.wait_ready(LOAD_TIMEOUT_S)
        load_s = time.perf_counter() - start
        ran = worker.request("run", None, timeout=options.timeout or REFERENCE_LIMIT_S)
        done = worker.request("finish", None, timeout=60)
    finally:
        worker.close()
    return _calibration(ready, load_s, float(ran["seconds"]), int(done.get("peak_mem_bytes") or 0))


@dataclass
class _RunState:
    """What a run's batches share: the pipeline options a budget plan chose."""

    overrides: dict[str, Any]


def _start(options: BenchOptions, spec: ConfigSpec, position: int, batch: int, hardware: Hardware, store: Store,
           run_id: int, executor: Executor, overrides: dict[str, Any], config_id: int | None = None,
           slots: list[Slot] | None = None) -> Slot:
    """A configuration's slot with its worker starting; added to ``slots`` before the worker starts,
    so a configuration whose start is interrupted (Ctrl-C) or fails is still recorded with the run."""
    if config_id is None:
        config_id = store.add_config(run_id, position=position, name=spec.name, batch=batch)
    slot = Slot(spec, config_id)
    if slots is not None:
        slots.append(slot)
    slot.worker = executor.start(serve, job_for(spec, pipeline=options.pipeline, size=options.size, seed=options.seed,
                                         batch=batch, hardware=hardware, device=options.device, overrides=overrides))
    return slot


def _calibration(ready: dict[str, Any], load_s: float, run_s: float, peak_bytes: int = 0, busy: int = 0) -> Calibration:
    """A calibration from a worker's ``ready`` message and what its first run measured."""
    work = ready.get("work")
    cpu = ready.get("load_cpu_s")
    return Calibration(load_s=load_s, run_s=run_s, weight_bytes=int(ready.get("weight_bytes") or 0), peak_bytes=peak_bytes,
                       work=(work[0], int(work[1])) if work else None, work_min=int(work[2]) if work else None,
                       load_cpu_s=float(cpu) if cpu is not None else None, busy=busy)


def _run_batch(options: BenchOptions, batch: int, hardware: Hardware, store: Store, run_id: int,
               executor: Executor, step: Callable[[str, int], None], budget: float | None, state: _RunState) -> list[str]:
    """Measure one batch size; returns notes for the run (the plan and time limits chosen).

    The fp32 reference worker's first run is the reference output. With a ``budget``
    it loads and runs alone, as the calibration the plan is made from, and the other
    workers load after it; without one, every worker loads at once. Then the rounds
    begin; with a budget, every call is first checked against the time left.
    """
    clock = options.clock
    began = clock()
    deadline = began + budget if budget is not None else None
    until = deadline + GRACE * budget if deadline is not None and budget is not None else None
    notes: list[str] = []
    slots: list[Slot] = []
    warmup, repeat = options.warmup, options.repeat
    ref_limit = options.timeout if options.timeout is not None else REFERENCE_LIMIT_S
    timed_rounds = repeat  # what a configuration that ran to the end has (a plan or the budget may change it)
    costs = [config_cost(spec, hardware) for spec in options.configs]
    order = drop_order(costs, [spec.kind in ("preset", "policy", "fp8") for spec in options.configs])
    left_out: dict[int, str] = {}  # position -> why the plan left it out

    def start_others() -> None:
        for position, spec in enumerate(options.configs[1:], start=1):
            if position in left_out:
                slot = Slot(spec, store.add_config(run_id, position=position, name=spec.name, batch=batch))
                slot.status, slot.error = "skipped", f"not measured: {left_out[position]}"
                slots.append(slot)
            else:
                _start(options, spec, position, batch, hardware, store, run_id, executor, state.overrides, slots=slots)

    def replan(plan: Plan, positions: list[int], when: str) -> None:
        """Take ``plan`` (made over the configurations at ``positions``) and say it."""
        nonlocal warmup, repeat
        warmup, repeat = plan.warmup, plan.repeat
        notes.append(f"batch {batch}: {when}{plan.reason}")
        for index in plan.dropped:
            left_out[positions[index]] = (f"the time budget left no room for it ({when}{plan.reason.split(';')[0]}; "
                                          f"about {plan.estimate_s:.0f} s for the rest)")
        if options.on_plan is not None:  # told the note's words, so a caller that says it can leave the note out
            options.on_plan(batch, dataclasses.replace(plan, reason=f"{when}{plan.reason}") if when else plan)

    try:
        reference = _start(options, options.configs[0], 0, batch, hardware, store, run_id, executor, state.overrides,
                           slots=slots)
        if budget is None:
            start_others()  # nothing to calibrate: every worker loads at once
        # The reference's load and first run are the calibration and the reference output:
        # without them nothing can be measured, so the budget does not stop them.
        load_s = wait_ready(reference, clock)
        step(f"batch {batch}: loaded {reference.spec.name}", 0)
        if reference.alive:
            reference.first = call(reference, ref_limit, "run", {"want_output": True}, clock=clock)
            step(f"batch {batch}: fp32 reference", 1)
        cal = None
        if budget is not None and reference.alive and reference.first:
            cal = _calibration(reference.ready, load_s, float(reference.first["seconds"]), busy=runnable_others() or 0)
            plan = plan_runs(cal, costs, budget_s=deadline - clock(), max_warmup=warmup, max_repeat=repeat,
                             cores=options.cores, order=order)
            replan(plan, list(range(len(costs))), "")
            if plan.work:
                # The reference is rebuilt at the smaller work size and run again.
                state.overrides.update(plan.work)
                reference.worker.close()
                slots[0] = reference = _start(options, options.configs[0], 0, batch, hardware, store, run_id, executor,
                                              state.overrides, config_id=reference.config_id)
                wait_ready(reference, clock, until)
                if reference.alive:
                    reference.first = call(reference, ref_limit, "run", {"want_output": True}, clock=clock, until=until)
                    if reference.first:
                        cal = dataclasses.replace(cal, run_s=float(reference.first["seconds"]))
        if len(slots) == 1:
            start_others()
        for slot in slots[1:]:  # the other workers load in parallel; collect them in order
            if slot.worker is not None and slot.alive:
                wait_ready(slot, clock, until)
                step(f"batch {batch}: loaded {slot.spec.name}", 0)

        limit = options.timeout
        if limit is None:
            per_run = (reference.first or {}).get("seconds")
            runs = warmup + repeat + 1
            limit = max(MIN_LIMIT_S, RELATIVE_LIMIT * per_run * runs) if per_run else REFERENCE_LIMIT_S
            notes.append(f"batch {batch}: time limit {limit:.0f} s per configuration"
                         + (f" ({RELATIVE_LIMIT:g}x the fp32 reference's {per_run:.2f} s per run over {runs} runs, "
                            f"at least {MIN_LIMIT_S:g} s)" if per_run else "")
                         + "; the reference itself is not timed out")
        # What the others are teacher-forced with: the fp32 run's output and extras (speech tokens, latents).
        forcing = ({"output": reference.first.get("output"), "extras": reference.first.get("extras", {})}
                   if reference.first else None)
        for slot in slots[1:]:
            if not slot.alive:
                continue
            if slot.spec.compile:
                # Its first call compiles: limited like a load, and not part of its runs' time limit.
                spent = slot.spent
                answer = call(slot, spent + LOAD_TIMEOUT_S, "reference", forcing, clock=clock, until=until)
                if slot.alive:
                    slot.compile_s = (answer or {}).get("compile_seconds")
                    slot.compile_cached = (answer or {}).get("compile_cached")
                    slot.spent = spent
                step(f"batch {batch}: compiled {slot.spec.name}", 0)
            else:
                call(slot, limit, "reference", forcing, clock=clock, until=until)

        if cal is not None and deadline is not None:
            # Plan again from the time actually left: loading may have taken longer than estimated.
            positions = [i for i, slot in enumerate(slots) if slot.alive]
            again = plan_runs(dataclasses.replace(cal, load_s=0.0, load_cpu_s=0.0), [costs[i] for i in positions],
                              budget_s=deadline - clock(), max_warmup=warmup, max_repeat=repeat, cores=options.cores,
                              order=[positions.index(i) for i in order if i in positions], can_shorten=False)
            if (again.warmup, again.repeat) != (warmup, repeat) or again.dropped:
                replan(again, positions, f"after loading ({clock() - began:.0f} s in): ")
                for index in again.dropped:
                    slot = slots[positions[index]]
                    stop_for_budget(slot, left_out[positions[index]])

        keeper = RoundKeeper(warmup, repeat, deadline, batch, clock=clock)
        round_index = 0
        out_of_time = False
        ref_run = float((reference.first or {}).get("seconds") or 0.0)
        while not out_of_time:
            def wide() -> list[tuple[str, Any]]:
                ratios = [(slot.spec.name, paired((reference.rounds, reference.samples), (slot.rounds, slot.samples)))
                          for slot in slots[1:] if slot.alive]
                return [(name, r) for name, r in ratios if r is not None and unsettled(r)]

            def slow_first() -> list[tuple[str, Any, float]]:
                alive = sorted((s for s in slots[1:] if s.alive), key=lambda s: -(s.last_s or 0.0))
                return [(s.spec.name, s, s.last_s or 0.0) for s in alive]

            go, dropped = keeper.go_on(round_index, wide, slow_first)
            for slot in dropped:
                stop_for_budget(slot, "the run fell behind its time budget before its first timed run")
            if not go:
                break
            timed = round_index >= keeper.warmup
            keeper.start_round()
            # Every other round runs in reverse order, so no configuration always runs in the
            # same place of the round (right after the reference, or last).
            for position, slot in (list(enumerate(slots)) if round_index % 2 == 0 else list(enumerate(slots))[::-1]):
                if not slot.alive or (slot is reference and round_index == 0 and keeper.warmup > 0):
                    continue  # fp32's reference run was its first warm-up
                if deadline is not None:
                    expected = slot.last_s if slot.last_s is not None else costs[position] * ref_run
                    if clock() + expected > deadline:
                        # This call would end past the deadline: not made, and no round after this one.
                        out_of_time = True
                        if not slot.samples:
                            stop_for_budget(slot, f"its {'first timed' if timed else 'warm-up'} run (about {expected:.1f} s) "
                                               f"would have ended past the time budget "
                                               f"({max(0.0, deadline - clock()):.0f} s left)")
                        continue
                want = slot.first is None
                result = call(slot, ref_limit if slot is reference else limit, "run", {"want_output": want},
                               clock=clock, until=until)
                if result is None:
                    out_of_time = out_of_time or slot.status in ("skipped", "partial")
                    continue
                slot.last_s = float(result["seconds"])
                if want:
                    slot.first = result
                fallbacks = int(result.get("fallbacks") or 0)
                if fallbacks > slot.fallbacks:
                    # A guard fallback ran inside this call: its time is not the configuration's.
                    slot.fallbacks = fallbacks
                    if timed:
                        slot.untimed += 1
                        keeper.notes.append(f"batch {batch}: {slot.spec.name}: a guard fallback ran during timed round "
                                            f"{round_index - keeper.warmup + 1}; that run is not timed")
                        continue
                if timed:
                    store.add_sample(slot.config_id, round_index - keeper.warmup, result["seconds"])
                    slot.samples.append(result["seconds"])
                    slot.rounds.append(round_index - keeper.warmup)
                step(f"batch {batch}: {'run' if timed else 'warm-up'} {slot.spec.name}", 1)
            keeper.end_round()
            round_index += 1
        if out_of_time:
            keeper.notes.append(f"batch {batch}: stopped after {max(0, round_index - keeper.warmup)} timed round(s): "
                                "the next runs would have ended past the time budget")
        keeper.adaptive_note(round_index)
        loaded = load_note(keeper.busy)
        if loaded:
            keeper.notes.append(f"batch {batch}: {loaded}")
        notes += keeper.notes
        # every round asked for ran: "ok" needs these (a round cut short by the budget is not counted)
        timed_rounds = max(0, round_index - keeper.warmup - (1 if out_of_time else 0))

        for slot in slots:
            if slot.alive:
                slot.done = call(slot, (ref_limit if slot is reference else limit) + 60, "finish", clock=clock) or {}
    finally:
        notes += _record(timed_rounds, batch, slots, store, hardware)
        notes += fp8_against_16bit(batch, slots)
        for slot in slots:
            if slot.worker is not None:
                slot.worker.close()
    return notes


def _record(repeat: int, batch: int, slots: list[Slot], store: Store, hardware: Hardware | None = None) -> list[str]:
    """Store each configuration's metrics and status; returns notes on unstable timings."""
    notes: list[str] = []
    stopped: dict[tuple[str, str | None], list[str]] = {}  # (status, why) -> configurations
    unstable: list[str] = []  # "name: why", said in one note after the loop
    reference = slots[0]
    ref_out = (reference.first or {}).get("output")
    ref_extras = (reference.first or {}).get("extras", {})
    for slot in slots:
        metrics: dict[str, Any] = {}
        if slot.samples:
            stats = bench_metrics.latency_stats(slot.samples)
            metrics.update({f"latency_{k}": v for k, v in stats.items() if k in ("median", "p10", "p90", "mean", "ci_low", "ci_high")})
            metrics["latency_ci_exact"] = 1.0 if stats.get("ci_exact", True) else 0.0
            median = stats["median"]
            metrics["throughput_items_per_s"] = batch / median
            ratio = paired((reference.rounds, reference.samples), (slot.rounds, slot.samples)) if reference.samples else None
            calibration = (reference.first or {}).get("seconds") if slot is reference else None
            why = instability(slot.samples, calibration=calibration)
            metrics.update(speed_metrics(ratio, slot.samples, why))
            contradicts = (hardware is not None and slot.spec.dtype and ratio is not None and ratio.verdict() != "undecided"
                           and contradiction(hardware, slot.spec.dtype, ratio.low, ratio.high))
            if contradicts:
                forgotten = forget(hardware)
                notes.append(f"batch {batch}: {contradicts}; "
                             + ("the cached probe was dropped, so the next process measures again"
                                if forgotten else "run `mixprec env` to measure again"))
            if why:
                unstable.append(f"{slot.spec.name}: {why}")
        # What was asked, stored with what was measured: a reader judges the rows, not the status alone.
        metrics["repeat_asked"] = repeat
        metrics["rounds_left_out"] = slot.untimed
        if slot.ready:
            # What is stored after the run: a guard's pins may have moved weights back to fp32.
            metrics["weight_bytes"] = (slot.done or {}).get("weight_bytes") or slot.ready.get("weight_bytes")

        if slot.compile_s is not None:
            metrics["compile_s"] = slot.compile_s
        if slot.compile_cached is not None:
            metrics["compile_cached"] = slot.compile_cached
        if slot.done:
            metrics["peak_mem_bytes"] = slot.done.get("peak_mem_bytes")
            metrics["fallbacks"] = slot.done.get("fallbacks", 0)
        first = slot.first or {}
        out = first.get("output")
        extras = first.get("extras", {})
        mismatch = out is not None and ref_out is not None and out.shape != ref_out.shape
        if mismatch:
            metrics["shape_mismatch"] = 1.0
        elif out is not None and ref_out is not None:
            kind = (reference.ready or slot.ready).get("output_kind", "embedding")
            metrics.update(bench_metrics.quality(out, ref_out, kind, sample_rate=extras.get("sample_rate")))
            steps, ref_steps = extras.get("noise_predictions"), ref_extras.get("noise_predictions")
            if steps is not None and ref_steps is not None and steps.shape == ref_steps.shape:
                # Teacher-forced: each step's noise prediction on the fp32 run's own latents.
                metrics.update(bench_metrics.step_quality(steps, ref_steps))
        if out is not None:
            metrics["nonfinite"] = int((~torch.isfinite(out)).sum())
            sample_rate = extras.get("sample_rate")
            if sample_rate and slot.samples:
                audio_seconds = out.shape[-1] / sample_rate
                metrics["rtf"] = metrics["latency_median"] / audio_seconds
            tokens = extras.get("speech_tokens")
            if tokens is not None and slot.samples:
                metrics["tokens_per_s"] = tokens.numel() / metrics["latency_median"]
            if extras.get("token_agreement") is not None:
                metrics["token_agreement"] = extras["token_agreement"]
            elif slot is reference and tokens is not None:
                metrics["token_agreement"] = 1.0
        status, error = slot.status, slot.error
        if status in ("skipped", "partial"):  # stopped for the time budget: the output says which and why
            stopped.setdefault((status, error), []).append(slot.spec.name)
        if status == "running":
            # Cut short (cancel, Ctrl-C, a crash of the runner): "ok" only with every sample.
            status = "ok" if len(slot.samples) + slot.untimed >= repeat else "partial"
            if status == "partial":
                error = f"stopped after {len(slot.samples)} of {repeat} timed runs"
        if mismatch and status in ("ok", "partial"):
            # Another output is not the same model at another precision: no quality to speak of.
            status, error = "failed", (f"output shape {tuple(out.shape)} differs from the fp32 reference's "
                                       f"{tuple(ref_out.shape)}: not comparable")
        policy = slot.ready.get("policy") if slot.ready else None
        store.finish_config(slot.config_id, status=status, metrics=metrics, error=error, policy=policy)
    if unstable:
        notes.append(f"batch {batch}: unstable timings of {few(unstable, sep='; ')}; re-run on a quiet machine or "
                     "raise --repeat")
    for (status, error), names in stopped.items():
        if status == "skipped":
            notes.append(f"batch {batch}: {few(names)} {error}")
        else:
            notes.append(f"batch {batch}: {few(names)} partly measured: {error}")
    return notes
