"""Autotune: the fastest (or smallest) policy that keeps a quality bound, measured.

:func:`tune` starts from all-16-bit weights (the fastest 16-bit type the hardware
probe measured fast), uses :func:`mixprec.profile` as a prior (the own error of every
layer, block and component), finds a small set to keep fp32 by group testing down the
module tree when the bound fails, then improves the policy by a greedy local search
(per-component storage, attention upcast, float32 matmul level). The search works to
the bound tightened by a margin on its search seeds; the chosen policy is then checked
on held-out validation seeds, stepping along the frontier if it misses. Every candidate is
measured end to end by an *evaluator*: :class:`~mixprec.tuning.evaluators.InProcessEvaluator`
(any module) or :class:`~mixprec.tuning.evaluators.WorkerEvaluator` (a registered pipeline
in one long-lived worker process).

Examples:
    >>> import mixprec
    >>> result = mixprec.tune("tts", "snr>=30", budget=40)
    >>> result.policy.save("tuned.toml")
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
import time
from typing import Any, Callable, Sequence

from mixprec._quote import quote
from mixprec.device.hardware import Hardware
from mixprec.pipelines import Pipeline
from mixprec.policy import Policy
from mixprec.policy.presets import PRESETS, preset
from mixprec.tuning.policies import STEP_PREFIX, load_policies, quiet_unmatched, say_notes, unmatched_notes
from mixprec.tuning.bounds import DEFAULT_MARGIN_DB, Bound, parse_bound, tightened
from mixprec.tuning.candidates import Candidate, frontier
from mixprec.tuning.evaluators import Evaluator, WorkerEvaluator
from mixprec.tuning.result import TuneResult, jsonable
from mixprec.tuning.retiming import finalists, pick_final, retime
from mixprec.tuning.progress import TuneMeter, TuneProgress
from mixprec.tuning.search import BudgetExhausted, Search, TuneStore, run_search
from mixprec.tuning.validation import validate_held_out, validation_seed_list

__all__ = ["OBJECTIVES", "tune", "stderr_progress", "STDERR_INTERVAL_S", "TuneInterrupted"]

#: What :func:`tune` can minimise: objective -> what it finds.
OBJECTIVES: dict[str, str] = {"latency": "the fastest policy", "memory": "the smallest weights"}


class TuneInterrupted(KeyboardInterrupt):
    """The user's interrupt (Ctrl-C) during :func:`tune`, raised once the run was kept as ``incomplete``.

    ``result`` holds what was measured before it (``None`` when the interrupt came before the
    first evaluation); ``run_id`` is the stored tune run when there is a store. A
    ``KeyboardInterrupt``, caught as one; its message says what was kept.
    """

    def __init__(self, result: TuneResult | None, run_id: int | None) -> None:
        count = result.evaluations if result is not None else 0
        kept = f"{count} evaluation{'s' if count != 1 else ''} measured"
        super().__init__(f"tune run {run_id} stored as incomplete, with the {kept}" if run_id is not None
                         else f"the tune run stopped after {kept}")
        self.result, self.run_id = result, run_id


def _needed(units: int) -> int:
    return 2 + math.ceil(math.log2(max(2, units))) + 1


def tune(
    pipeline: str | Pipeline,
    bound: str | Bound,
    *,
    objective: str = "latency",
    budget: int | None = None,
    seeds: Sequence[int] = (0, 1),
    evaluator: Evaluator | None = None,
    store: TuneStore | None = None,
    progress: Callable[[TuneProgress], None] | bool | None = None,
    should_stop: Callable[[], bool] | None = None,
    presets: Sequence[str] | None = None,
    policies: Sequence[str | Policy] = (),
    size: str = "default",
    repeat: int = 3,
    hardware: Hardware | None = None,
    dtypes: Sequence[str] | None = None,
    local_search: bool = True,
    try_compile: bool = False,
    fp8: bool = True,
    improvement: float = 0.03,
    final_rounds: int = 3,
    validation_seeds: int | Sequence[int] = 3,
    margin: float | None = None,
    device: str | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> TuneResult:
    """Find the fastest (or smallest) policy that meets ``bound``, by measurement.

    Args:
        pipeline: a registered pipeline name or a factory spec
            (``module.path:factory`` / ``path/to/file.py:factory``), measured in a
            :class:`~mixprec.tuning.evaluators.WorkerEvaluator`; or anything used only to label the run when
            ``evaluator`` is given.
        bound: e.g. ``"sqnr>=30"`` (see :func:`~mixprec.tuning.bounds.parse_bound`).
        objective: ``latency`` (median seconds) or ``memory`` (weight bytes).
        budget: most measured evaluations (cache hits are free); ``None``: no limit.
        seeds: quality seeds (worst case over them) for the default evaluator.
        evaluator: how to measure; default ``WorkerEvaluator(pipeline, size, seeds, repeat)``.
        store: a :class:`mixprec.bench.store.Store` to reuse and keep measurements.
        progress: called with a :class:`~mixprec.tuning.progress.TuneProgress` from the start:
            while the pipeline is built, after each run of the fp32 reference, of each
            evaluation, of the validation and of the final re-timing, after each pass of a
            risk profile (``work`` says what runs, how far it is and about how long it has
            left), and after each candidate (``work`` is ``None``). By default a line goes to
            stderr at once, after each candidate and at most every
            :data:`STDERR_INTERVAL_S` seconds in between (``progress=False``: silent).
        should_stop: checked before each measurement; when it returns true the
            search stops and the result holds what was measured (a note says so).
        presets: presets measured as candidates too, so the result is never worse
            than a measured preset; default: every preset when ``pipeline`` is a
            registered pipeline measured by the default evaluator, none otherwise.
        policies: your own policies (files or :class:`~mixprec.policy.Policy` objects), measured as
            candidates too, as the presets are, so the result is never worse than them. Their
            rules that match no module are said before the search (a warning on the ``mixprec``
            logger, once per process) and kept in the result's notes.
        size: pipeline size for the default evaluator.
        repeat: timed runs per evaluation for the default evaluator.
        hardware: the probed device (default :func:`mixprec.device.hardware.probe` of the
            device the pipeline is measured on).
        dtypes: 16-bit storage types to try (default: those the probe measured fast).
        local_search: run the greedy local search after the bisection.
        fp8: with the memory objective, also try fp8 weights (a scale per output channel)
            and find the layers that must stay 16-bit (:func:`~mixprec.tuning.search.fp8_pass`).
        try_compile: the local search also tries compiling the components
            (``Policy.compile``) as its last move, kept where it measures faster
            (its compiling first call is not timed). Needs a C++ compiler on CPU.
        improvement: relative latency gain a local move must show to be accepted,
            and a finalist must show over the fastest preset to replace it.
        final_rounds: for the latency objective, re-time the three fastest candidates
            meeting the bound and the fastest preset meeting it side by side over this
            many interleaved rounds; the preset stays the answer unless a finalist is
            faster in every round and by more than ``improvement`` (0: skip; needs an
            evaluator with a ``time`` method).
        validation_seeds: held-out seeds the chosen policy must also meet the bound
            on: a count (that many seeds after the search seeds) or a list; 0
            disables validation (the result says so). When the chosen policy misses
            the bound on one of them, the next candidate of the frontier that meets
            it is chosen (each measured on the validation seeds) and a note says so.
        margin: dB of error the search keeps below the bound (:func:`~mixprec.tuning.bounds.tightened`), so
            the answer is not tuned to the edge of what the search seeds allow;
            default :data:`~mixprec.tuning.bounds.DEFAULT_MARGIN_DB`; 0: search to the bound itself.
        device: where the default evaluator builds and measures the pipeline (``cpu``,
            ``cuda``, ``cuda:1``, ``mps``), passed to its factory when the factory accepts
            it (else the pipeline is moved there); ``None``: the factory's own default
            (``cpu`` for the reference pipelines). With your own ``evaluator`` it only
            names the device, for the probe and the stored run. The result and the stored
            tune run keep it (:attr:`~mixprec.tuning.result.TuneResult.device`).
        clock: monotonic seconds the progress estimates are measured on.

    Returns:
        A :class:`~mixprec.tuning.result.TuneResult`.

    Raises:
        ValueError: unknown objective or dtype, a bad bound, a negative margin, validation
            seeds shared with the search seeds, a device this machine cannot use (before
            any work), or a budget too small for baseline + all-16-bit + one bisection pass
            (the message says how many).
        TuneInterrupted: Ctrl-C at any moment once the arguments were checked: the worker is
            stopped, and what was measured (nothing, before the first evaluation) is kept as an
            ``incomplete`` tune run in ``store``.
    """
    from mixprec.measure.machine import machine_fingerprint
    from mixprec.device.hardware import probe, resolve_device

    start = time.perf_counter()
    bound = parse_bound(bound)
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {quote(objective)}; valid: {', '.join(OBJECTIVES)}")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise ValueError(f"budget must be a positive number of evaluations or None, got {quote(budget)}")
    margin_db = DEFAULT_MARGIN_DB if margin is None else float(margin)
    search_bound = tightened(bound, margin_db)
    search_seeds = [int(x) for x in getattr(evaluator, "seeds", seeds)] if evaluator is not None else [int(x) for x in seeds]
    held_out = validation_seed_list(validation_seeds, search_seeds)
    for d in dtypes or ():
        if d not in ("bf16", "fp16"):
            raise ValueError(f"unknown 16-bit dtype {quote(d)}; valid: bf16, fp16")
    user_policies = load_policies(policies)  # a missing or malformed file: refused before any work
    owned = evaluator is None
    if owned and device is not None:
        device = str(resolve_device(device))  # a device this machine lacks is refused before any worker starts
    if progress is None:
        progress = stderr_progress()
    elif progress is False:
        progress = None
    runs = (len(search_seeds) + int(repeat) if owned
            else (len(search_seeds) + int(evaluator.repeat) if isinstance(getattr(evaluator, "repeat", None), int) else None))
    meter = TuneMeter(progress, budget=budget, clock=clock, runs_per_evaluation=runs) if progress is not None else None
    has_progress = not owned and hasattr(evaluator, "progress")
    previous = evaluator.progress if has_progress else None
    search: Search | None = None
    interrupted: str | None = None  # what a Ctrl-C stopped, when one did
    quiet = quiet_unmatched()  # a user policy's unmatched rules are said once, below, not by every apply
    quiet.__enter__()
    try:
        if owned:
            name = str(getattr(pipeline, "name", pipeline))
            if meter is not None:
                meter.begin(f"starting a worker and building the {name} pipeline ({size} size)", prefix=False)
            evaluator = WorkerEvaluator(name, size, seeds=seeds, repeat=repeat, device=device,
                                        progress=meter.worker if meter is not None else None)
        # an evaluator that reports its runs reports them to this run's meter, and to what it reported to after
        if has_progress and meter is not None:
            evaluator.progress = meter.worker
        # The probe measures where the pipeline lives: the device asked for, else where the worker built it.
        where = device if device is not None else (getattr(evaluator, "ready", None) or {}).get("device")
        hw = hardware if hardware is not None else probe(where)
        run_device = where or hw.device_type
        fast = list(dtypes) if dtypes is not None else hw.fast_16bit()
        # looked at on the evaluator's own modules, else on the pipeline its workers build
        notes: list[str] = unmatched_notes(user_policies, pipeline=getattr(evaluator, "pipeline", None),
                                           target=getattr(evaluator, "target", None),
                                           size=getattr(evaluator, "size", size))
        say_notes(notes)
        if margin_db:
            notes.append(f"search bound {search_bound}: {bound} with a {margin_db:g} dB margin")
        if not fast:
            notes.append(f"no 16-bit type measured fast on {hw.name}: "
                         + ("16-bit storage with fp32 compute only" if objective == "memory"
                            else "16-bit compute cannot win on latency here, so the search covers fp32 settings and the presets"))
        units = evaluator.units()
        if not units:
            notes.append("the model holds no floating-point weights: there is nothing to store in 16 bits, so the "
                         "candidates differ only in their numeric settings (float32 matmul precision) and compute")
        names = list(PRESETS) if presets is None and owned else list(presets or ())
        for name in names:
            if name not in PRESETS:
                raise ValueError(f"unknown preset {quote(name)}; valid: {', '.join(PRESETS)}")
        hints = tuple(evaluator.sensitive()) if hasattr(evaluator, "sensitive") else ()
        preset_policies = [(name, preset(name, hardware=hw, hints=hints)) for name in names]
        preset_policies += [(STEP_PREFIX + label, policy) for label, policy in user_policies]
        needed = _needed(len(units)) + len(preset_policies)
        if budget is not None and budget < needed:
            raise ValueError(f"budget={budget} is too small for one pass over {len(units)} modules: it needs at least "
                             f"{needed} evaluations (baseline + all-16-bit + {len(names)} presets"
                             + (f" + {len(user_policies)} policies of yours" if user_policies else "") + " + a bisection pass)")
        search = Search(evaluator, search_bound, objective, budget, store, None, machine_fingerprint(hw), should_stop,
                        meter=meter)
        try:
            run_search(search, evaluator, fast, notes, local_search, improvement, preset_policies, try_compile=try_compile,
                       fp8=fp8)
        except BudgetExhausted:
            notes.append("stopped on request; the result holds what was measured" if search.cancelled
                         else f"budget of {budget} evaluations exhausted")
        except KeyboardInterrupt:  # Ctrl-C: what was measured is kept, as a cancel keeps it; nothing more is run
            if not search.path:
                raise
            search.cancelled, interrupted = True, "the search"
        final: dict[int, list[float]] = {}
        if objective == "latency" and final_rounds > 0 and hasattr(evaluator, "time") and not search.cancelled:
            try:
                final = _final_check(search, evaluator, final_rounds, notes, meter)
            except KeyboardInterrupt:
                search.cancelled, interrupted = True, "the final check (the choice is the search's)"
        if not search.path:
            raise ValueError("the search was stopped before its first evaluation; nothing was measured")
        best = _pick(search, final, improvement, notes)
        validation, summary, validations = None, {}, 0
        if best is not None and not search.cancelled:
            try:
                best, validation, summary, validations = validate_held_out(search, evaluator, bound, best, held_out,
                                                                            search_seeds, notes)
            except KeyboardInterrupt:
                search.cancelled, interrupted = True, "the held-out validation (the choice was not checked on held-out seeds)"
        if interrupted:
            notes.append(f"interrupted (Ctrl-C) during {interrupted}; the result holds what was measured")
    except KeyboardInterrupt:  # before the first evaluation: the run is kept, with nothing measured
        raise TuneInterrupted(None, _store_unmeasured(store, pipeline, bound, search_bound, objective, margin_db,
                                                      search_seeds, device, time.perf_counter() - start)) from None
    finally:
        quiet.__exit__(None, None, None)
        if owned and evaluator is not None:
            evaluator.close()
        elif has_progress:
            evaluator.progress = previous
    result = _result(search, bound, objective, notes, time.perf_counter() - start, final, best)
    result.search_bound, result.margin_db, result.search_seeds = search_bound, margin_db, search_seeds
    result.validation, result.seed_summary, result.validations = validation, summary, validations
    result.device = run_device
    result.status = "incomplete" if interrupted else "cancelled" if search.cancelled else "complete"
    if validation is not None and not validation["met"]:
        result.met, result.miss = False, bound.miss({bound.key: validation["worst"]})
    run_id = None
    if store is not None:
        run_id = store.add_tune_run(pipeline=_label(pipeline), bound=str(bound), objective=objective, met=result.met,
                                    evaluations=result.evaluations, cached=result.cached, wall_s=result.wall_s,
                                    policy_toml=result.to_toml(), result=jsonable(result.to_dict()))
    if interrupted:
        raise TuneInterrupted(result, run_id)
    return result


def _label(pipeline: Any) -> str:
    return str(getattr(pipeline, "name", pipeline))


def _final_check(search: Search, evaluator: Evaluator, rounds: int, notes: list[str],
                 meter: TuneMeter | None) -> dict[int, list[float]]:
    """The finalists re-timed side by side over ``rounds`` interleaved rounds (empty: fewer than two)."""
    contenders = finalists(search)
    if len(contenders) <= 1:
        return {}
    if meter is not None:
        meter.begin(f"re-timing {len(contenders)} finalists side by side", (rounds + 1) * len(contenders))
    final = retime(evaluator, contenders, rounds, after=meter.tick if meter is not None else None)
    medians = ", ".join(f"#{i} {statistics.median(v) * 1e3:.1f} ms" for i, v in final.items())
    notes.append(f"final check: {len(contenders)} finalists re-timed side by side over {rounds} "
                 f"interleaved rounds (median): {medians}")
    drift = [f"#{c.index} {c.evaluation.latency_s * 1e3:.1f} ms in the search vs "
             f"{statistics.median(final[c.index]) * 1e3:.1f} ms in the final check" for c in contenders
             if not 0.5 <= c.evaluation.latency_s / max(statistics.median(final[c.index]), 1e-12) <= 2.0]
    if drift:
        notes.append("the machine's load changed during the search: " + "; ".join(drift)
                     + "; the choice uses only the side-by-side final check (re-run on a quiet machine "
                     "for search timings that agree)")
    return final


def _store_unmeasured(store: TuneStore | None, pipeline: Any, bound: Bound, search_bound: Bound, objective: str,
                      margin_db: float, seeds: list[int], device: str | None, wall_s: float) -> int | None:
    """A run interrupted before its first evaluation, kept as ``incomplete`` with nothing measured
    (no policy chosen: its ``policy_toml`` is empty); its id, or ``None`` without a store."""
    if store is None:
        return None
    result = {"bound": str(bound), "objective": objective, "device": device, "met": False, "miss": None,
              "chosen": None, "closest": None, "frontier": [], "evaluations": 0, "cached": 0, "wall_s": wall_s,
              "notes": ["interrupted (Ctrl-C) before the first evaluation; nothing was measured"], "policy": None,
              "final": {}, "search_bound": str(search_bound), "margin_db": margin_db, "search_seeds": list(seeds),
              "validation": None, "validations": 0, "seed_summary": {}, "status": "incomplete", "path": []}
    return store.add_tune_run(pipeline=_label(pipeline), bound=str(bound), objective=objective, met=False,
                              evaluations=0, cached=0, wall_s=wall_s, policy_toml="", result=result)


#: Seconds between the default progress lines of :func:`tune` while a step runs.
STDERR_INTERVAL_S = 10.0


def stderr_progress(interval: float = STDERR_INTERVAL_S, *, clock: Callable[[], float] = time.monotonic,
                    file: Any = None) -> Callable[[TuneProgress], None]:
    """The default progress of :func:`tune`: a line on stderr (or ``file``) at once, after each
    candidate, and at most every ``interval`` seconds while a step runs, so a long search
    called from a script or a notebook is never silent for long."""
    last = [-math.inf]

    def report(event: TuneProgress) -> None:
        now = clock()
        if event.work is not None and now - last[0] < interval:
            return
        last[0] = now
        print(f"mixprec tune: {event.text()}", file=file if file is not None else sys.stderr, flush=True)

    return report


def _pick(search: Search, final: dict[int, list[float]], margin: float, notes: list[str]) -> Candidate | None:
    """The best candidate meeting the search bound: the side-by-side re-timing's winner when there was one."""
    best = search.best()
    if best is not None and final:
        # the presets and the fp32 baseline are the known answers: another policy must clearly beat them
        known = [i for i in final if i == 0 or search.path[i].step.startswith(("preset ", STEP_PREFIX))]
        index, why = pick_final(final, known, margin=margin)
        best = search.path[index]
        notes.append(why)
    return best


def _result(search: Search, bound: Bound, objective: str, notes: list[str], wall_s: float,
            final: dict[int, list[float]], best: Candidate | None) -> TuneResult:
    closest = None
    miss = None
    if best is None:
        closest = min(search.path, key=lambda c: (c.miss, search.cost(c)))
        miss = bound.miss(closest.evaluation.quality)
        if miss == 0:
            notes.append(f"the closest candidate (#{closest.index}) meets {bound} but not the search bound "
                         f"{search.bound} (the margin): --margin 0 would accept it")
        chosen = closest
    else:
        chosen = best
    rules = tuple(dataclasses.replace(r, reason=f"{r.reason} [tuned for {bound}, {objective}]") for r in chosen.policy.rules)
    policy = Policy(rules, chosen.policy.numerics, name="tuned", compile=chosen.policy.compile)
    return TuneResult(policy=policy, bound=bound, objective=objective, met=best is not None, chosen=chosen,
                      closest=closest, miss=miss, frontier=frontier(search.path, search.bound), evaluations=search.measured,
                      cached=search.cached, wall_s=wall_s, path=list(search.path), notes=notes, final=final)
