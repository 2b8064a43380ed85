"""A preset checked on the user's own model: its candidates timed on the model, on its device.

:func:`calibrate` resolves a preset's candidates (:mod:`~mixprec.calibration.candidates`),
runs the untouched fp32 model once for the reference output, then each candidate once
(warm-up, and its quality against fp32 on the same inputs: a candidate with non-finite
outputs, an error, or quality below the preset's floor is out), then times the
candidates in paired, interleaved rounds (:class:`~mixprec.device.clock.CpuTime` on a CPU,
CUDA events on a GPU), one candidate applied at a time and reverted before the next, until
the comparison is settled (:mod:`~mixprec.calibration.decide`), ``max_rounds`` rounds, or
the ``time_limit``. The rule-based choice stays unless another candidate is supported
faster; where the rounds cannot decide, it stays and the result says ``undecided`` and why.

A decided result is remembered (:mod:`~mixprec.calibration.cache`): the next process with
the same model structure, input shapes, device and versions applies it without running
the model.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import statistics
import time
from typing import Any, Callable, Mapping

import torch

from mixprec._quote import quote
from mixprec.calibration import cache as decisions
from mixprec.calibration.candidates import REFERENCE, Candidate, candidates
from mixprec.calibration.components import measure_components
from mixprec.calibration.decide import MARGIN, MIN_ROUNDS, compare
from mixprec.calibration.result import Calibration
from mixprec.calibration.trials import ROUND_TARGET_S, Trials, default_run, detached, device_of, output_quality, short
from mixprec.casting.apply import Applied, applied_part
from mixprec.casting.apply import apply as apply_policy
from mixprec.casting.targets import ApplyError, components_of, refuse_context, refuse_tensors, weight_bytes
from mixprec.device.clock import Clock, clock_for
from mixprec.device.hardware import Hardware, probe
from mixprec.measure.stats import paired_ratio
from mixprec.pipelines._base import Pipeline
from mixprec.policy import Policy, Rule
from mixprec.policy.presets import check_name, native16, preset as resolve_preset

__all__ = ["calibrate", "Calibration", "apply", "FLOORS_DB", "TIME_LIMIT_S", "MAX_ROUNDS"]

#: The quality floor of each preset: the worst SQNR (dB) of the model's outputs against fp32 on
#: the same inputs that a candidate must reach. bf16 weights measured 49 dB on real
#: all-MiniLM-L6-v2, 41 dB on the tts pipeline and 27.5 dB on the diffusion pipeline's images
#: (teacher-forced, test size): ``balanced`` keeps what its rules give there, and rules out a
#: candidate that loses more.
FLOORS_DB: dict[str, float] = {"quality": math.inf, "balanced": 25.0, "fast": 20.0, "memory": 20.0}
#: Default seconds a calibration may take, the fp32 reference and warm-up included (wall clock).
TIME_LIMIT_S = 20.0
#: Default most timed rounds (each round calls every candidate once).
MAX_ROUNDS = 30


# --------------------------------------------------------------------------- the calibration


def calibrate(
    target: Any,
    preset: str = "fast",
    inputs: Any = None,
    *,
    run: Callable[[Any], Any] | None = None,
    hints: tuple[str, ...] | list[str] | None = None,
    hardware: Hardware | None = None,
    floor_db: float | None = None,
    time_limit: float = TIME_LIMIT_S,
    max_rounds: int = MAX_ROUNDS,
    cache: bool | str = True,
    clock: Clock | None = None,
    now: Callable[[], float] = time.monotonic,
) -> Calibration:
    """Time a preset's candidates on the model itself and keep the fastest that meets its quality floor.

    A model of several components (a pipeline, a mapping of named modules) is calibrated per
    component (:mod:`~mixprec.calibration.components`): one fp32 run is recorded, each
    component is timed alone on its recorded calls under each candidate, the fastest
    qualifying choices are composed and the composition is checked end to end. A model of
    one component has its candidates timed whole.

    Args:
        target: an ``nn.Module``, a mapping of named modules, or a pipeline (mixprec's
            reference pipelines and wrapped apps: their ``example_inputs`` and ``run``
            are used where ``inputs`` and ``run`` are not given).
        preset: ``balanced``, ``fast`` or ``memory`` (``quality`` is fp32 by definition:
            returned as resolved, nothing timed).
        inputs: example inputs, as the app calls the model: a tuple of positional
            arguments, a dict of keyword arguments, or one value. The decision is valid
            for inputs of these shapes and dtypes.
        run: ``inputs -> outputs`` (default: ``target(*inputs)`` / ``target(**inputs)`` /
            ``target(inputs)``; a pipeline's ``run``). Every floating-point tensor of the
            outputs is compared with fp32's.
        hints: precision-sensitive module names for the presets (default: a pipeline's own).
        hardware: the probe of the model's device (default: :func:`mixprec.device.hardware.probe`).
        floor_db: the worst output SQNR against fp32 a candidate must reach (default
            :data:`FLOORS_DB` of the preset).
        time_limit: wall seconds the whole calibration may take, the fp32 reference and
            the warm-up included; the rounds stop before one would cross it.
        max_rounds: most timed rounds.
        cache: ``True``: reuse a remembered decision and remember a new decided one;
            ``"refresh"``: measure again and remember; ``False``: neither read nor write.
        clock: what times the calls (default :func:`~mixprec.device.clock.clock_for` the
            model's device: CPU time on a CPU, CUDA events on a GPU).
        now: the wall clock the time limit is read from.

    Returns:
        A :class:`Calibration`; apply its ``policy`` (or use ``mixprec.apply(model, "fast",
        calibrate=inputs)``, which does both).

    Raises:
        UnknownPresetError: a name that is not a preset.
        ApplyError: the target already has a policy applied.
        ValueError: no inputs for a model that is not a pipeline, a bad option, or the fp32
            model itself failing on the inputs (its own error, chained).

    Examples:
        >>> result = mixprec.calibrate(model, "fast", (input_ids,))
        >>> print(result.headline())
        >>> with mixprec.apply(model, result.policy):
        ...     model(input_ids)
    """
    started = now()
    refuse_context("mixprec.calibrate")
    name = check_name(preset)
    if cache not in (True, False, "refresh"):
        raise ValueError(f"cache={quote(cache)}: choose True, False or 'refresh'")
    if not (isinstance(time_limit, (int, float)) and time_limit > 0):
        raise ValueError(f"time_limit={quote(time_limit)}: give a positive number of seconds")
    if not (isinstance(max_rounds, int) and max_rounds >= 1):
        raise ValueError(f"max_rounds={quote(max_rounds)}: give a whole number of rounds, at least 1")
    components, own_hints = components_of(target)
    refuse_tensors(components)
    busy = applied_part(components)
    if busy is not None:
        raise ApplyError(f"component {busy!r} already has a mixprec policy applied: calibrate the model as it is "
                         "(revert that policy first), since the reference must be the untouched fp32 model")
    pipeline = isinstance(target, Pipeline)
    if inputs is None:
        if not pipeline:
            raise ValueError(f"calibrate needs example inputs for a {type(target).__name__}: the model is timed on them "
                             "(a tuple of positional arguments, a dict of keyword arguments, or one value)")
        inputs = target.example_inputs(1, 0)
    run = run or default_run(target)
    device = device_of(components)
    hw = hardware if hardware is not None else probe(device)
    hints = tuple(own_hints if hints is None else hints)
    floor = float(FLOORS_DB[name] if floor_db is None else floor_db)
    clock = clock or clock_for(device)

    if name == "quality":
        policy = resolve_preset(name, hardware=hw, hints=hints)
        return Calibration(name, policy, "rules", "rules", True,
                           ("quality is fp32 at float32 matmul precision 'highest' by definition: nothing to choose, nothing timed",),
                           device=hw.name, floor_db=None)

    same = _nothing_to_choose(name, hw, hints)
    if same is not None:
        return Calibration(name, _untouched(name), REFERENCE, "rules", True, (same,), device=hw.name, floor_db=floor,
                           seconds=round(now() - started, 3))

    fields = decisions.key_fields(name, components, inputs, hw, hints=hints, floor_db=floor)
    if cache is True:
        record = decisions.lookup(fields)
        if record is not None:
            return _remembered(record)

    if len(components) > 1:
        result = measure_components(target, run, inputs, name, hw, hints, floor, clock, time_limit, max_rounds, now,
                                    started, pipeline, cache)
    else:
        result = _measure(target, run, inputs, name, hw, hints, floor, clock, time_limit, max_rounds, now, started, pipeline)
    if cache and result.decided:
        path = decisions.store(fields, result.to_dict())
        result = dataclasses.replace(result, cache_path=str(path) if path else None)
    elif cache and not result.decided:
        result = dataclasses.replace(result, reasons=result.reasons + (
            "not remembered: an undecided calibration is measured again by the next one",))
    return result


_calibrate = calibrate  # apply's own argument is named calibrate


def _untouched(name: str) -> Policy:
    return Policy((Rule("*", storage="fp32", optional=True, reason=f"{name} calibrated: fp32 was fastest on this model"),),
                  None, name=name)


def _nothing_to_choose(name: str, hw: Hardware, hints: tuple[str, ...]) -> str | None:
    """Why every candidate of ``name`` computes what fp32 computes on ``hw``, so there is nothing to time;
    ``None`` where some candidate computes otherwise (a native 16-bit type, a matmul level that changes
    results, 16-bit or fp8 weights)."""
    if native16(hw):
        return None
    for cand in candidates(name, hw, hints):
        policy = cand.policy
        if policy is None:
            continue
        if any(r.storage not in (None, "fp32") or r.compute not in (None, "native", "fp32") for r in policy.rules):
            return None
        level = policy.numerics.matmul if policy.numerics is not None else "highest"
        if level != "highest" and not hw.matmul_exact.get(level):
            return None
    return (f"nothing to choose on this device: no 16-bit type is native on {hw.name} and every candidate of {name} "
            "computes what fp32 computes (its float32 matmul levels give fp32's bits, as the probe compared): the model "
            "stays as it is, nothing was run")


#: The memory preset's fp8 candidate (:func:`mixprec.calibration.candidates.candidates`).
FP8_LEVEL = "rules-fp8"


def _fp8_kept_note(figures: dict[str, dict[str, Any]], eligible: list[str], floor: float) -> str | None:
    """Why memory keeps its fp8 level, where that candidate met the floor; else ``None``."""
    if FP8_LEVEL not in eligible:
        return None
    fig = figures[FP8_LEVEL]
    sixteen = [figures[label]["weight_bytes"] for label in eligible if label != FP8_LEVEL and figures[label]["weight_bytes"]]
    than = f" against {min(sixteen) / 2**20:,.1f} MiB with 16-bit weights" if sixteen else ""
    return (f"memory's fp8 level kept: output SQNR {fig['sqnr_db']:.1f} dB against fp32 meets memory's floor of "
            f"{floor:g} dB, with {fig['weight_bytes'] / 2**20:,.1f} MiB of weights{than} (not timed: memory's "
            "objective is weight bytes; `mixprec tune --objective memory` also finds per-layer exceptions)")


def _remembered(record: Mapping[str, Any]) -> Calibration:
    found = Calibration.from_dict(record)
    return dataclasses.replace(found, source="cache", cache_path=record.get("path") or found.cache_path,
                               reasons=(f"remembered: decided on {found.device} at {found.when} in {found.clock} over "
                                        f"{found.rounds} paired rounds; the model was not run",) + found.reasons)


def _measure(target: Any, run: Callable[[Any], Any], inputs: Any, name: str, hw: Hardware, hints: tuple[str, ...],
             floor: float, clock: Clock, time_limit: float, max_rounds: int, now: Callable[[], float], started: float,
             pipeline: bool) -> Calibration:
    cands = candidates(name, hw, hints)
    by_label = {c.label: c for c in cands}
    trials = Trials(target, run, inputs, clock)
    try:
        with torch.inference_mode():
            reference, reference_s = clock.time(lambda: run(inputs))
    except Exception as exc:
        raise ValueError(f"the fp32 model itself failed on the example inputs ({short(exc)}): calibrate needs inputs "
                         "the model runs on") from exc
    if pipeline:
        trials.inputs = target.teacher_forced(inputs, reference)  # replay fp32's discrete choices
    ref = detached(reference)
    del reference

    figures: dict[str, dict[str, Any]] = {}
    live: list[Candidate] = []
    last_trial, first_calls = 0.0, {}
    for cand in cands:
        fig = {"label": cand.label, "what": cand.what, "also": list(cand.also), "eligible": cand.eligible,
               "sqnr_db": None, "nonfinite": 0, "out": None, "weight_bytes": None, "median_s": None,
               "vs_fp32": None, "status": None}
        figures[cand.label] = fig
        # The rules always run; the untouched model's first call was the reference run (nothing to spend).
        if cand.label != "rules" and cand.policy is not None and now() - started + last_trial > time_limit:
            fig["out"] = f"not tried: the time limit ({time_limit:g} s) came first"
            continue
        begin = now()
        try:
            if cand.policy is None:  # the untouched model: its reference run was its first call
                out, size, seconds = ref, weight_bytes(trials.components), reference_s
            else:
                out, size, seconds = trials.first(cand)
            sqnr, nonfinite = output_quality(out, ref)
        except Exception as exc:  # noqa: BLE001 - any failure of a candidate rules it out, said with its error
            fig["out"] = f"failed: {short(exc)}"
            continue
        finally:
            last_trial = now() - begin
            first_calls[cand.label] = last_trial
        fig.update(sqnr_db=sqnr if cand.policy is not None else math.inf, nonfinite=nonfinite, weight_bytes=size)
        if nonfinite:
            fig["out"] = f"{nonfinite} non-finite output values"
        elif cand.policy is not None and not sqnr >= floor:
            fig["out"] = f"output SQNR {sqnr:.1f} dB against fp32, below {name}'s floor of {floor:g} dB"
        trials.calls[cand.label] = max(1, min(10, math.ceil(ROUND_TARGET_S / max(seconds, 1e-6))))
        live.append(cand)

    samples: dict[str, list[float]] = {c.label: [] for c in live}
    qualified = [c.label for c in live if figures[c.label]["out"] is None]
    eligible = [label for label in qualified if by_label[label].eligible]
    fp8_note = _fp8_kept_note(figures, eligible, floor)
    if fp8_note is not None:  # memory's objective is weight bytes: its fp8 level wins wherever its quality holds
        eligible = [FP8_LEVEL]
    incumbent = "rules" if "rules" in eligible else (REFERENCE if REFERENCE in eligible else (eligible[0] if eligible else None))
    # Until a round has run, its cost is estimated from the candidates' first calls.
    rounds, last_round, stop_reason = 0, sum(first_calls.get(c.label, 0.0) for c in live), None
    verdicts = None
    if incumbent is not None and len(eligible) > 1:
        while True:
            if rounds >= max_rounds:
                stop_reason = f"the most rounds ({max_rounds})"
                break
            if now() - started + last_round > time_limit:
                stop_reason = f"the time limit ({time_limit:g} s)"
                break
            begin = now()
            order = live if rounds % 2 == 0 else live[::-1]  # alternate the order: no candidate always runs first
            for cand in order:
                samples[cand.label].append(trials.timed(cand))
            rounds += 1
            last_round = now() - begin
            if rounds >= MIN_ROUNDS:
                # Of candidates timed alike, the simpler change is kept: compare lets the later win ties.
                challengers = sorted((label for label in eligible if label != incumbent), key=lambda l: by_label[l].simplicity)
                verdicts = compare(samples, incumbent, challengers,
                                   quality={label: figures[label]["sqnr_db"] for label in eligible})
                if verdicts.settled:
                    break

    reasons: list[str] = []
    for label in samples:
        fig = figures[label]
        if samples[label]:
            fig["median_s"] = statistics.median(samples[label])
        if REFERENCE in samples and samples[REFERENCE] and samples[label] and label != REFERENCE:
            fig["vs_fp32"] = paired_ratio(samples[REFERENCE], samples[label]).to_dict()
    if verdicts is not None:
        figures[incumbent]["status"] = "incumbent"
        for label, status in verdicts.status.items():
            figures[label]["status"] = status

    chosen, decided = "rules", False
    if fp8_note is not None:
        reasons.append(fp8_note)
    if incumbent is None:
        reasons.append(f"no candidate {name} may choose met its floor of {floor:g} dB without an error: the rule-based "
                       "choice stays, unchecked")
    elif len(eligible) == 1:
        chosen, decided = incumbent, True
        if fp8_note is None:
            reasons.append(f"only {incumbent} qualified: kept without timing")
    elif verdicts is None:
        reasons.append(f"undecided: {rounds} timed rounds before {stop_reason}, {MIN_ROUNDS} needed for a verdict; "
                       f"the rule-based choice stays (give a longer time_limit)")
        chosen = "rules" if "rules" in qualified else incumbent
    else:
        chosen, decided = verdicts.winner, True
        if incumbent != "rules" and "rules" in by_label:
            reasons.append(f"rules out ({figures['rules']['out']}): {incumbent} is the incumbent")
        beaten = verdicts.ratios.get(chosen)
        if chosen != incumbent and beaten is not None:
            reasons.append(f"kept {chosen}: {beaten.text()} the speed of {incumbent} over {beaten.n} paired rounds "
                           f"in {clock.name}")
        else:
            reasons.append(f"kept {chosen}: no candidate was supported faster")
        if not verdicts.settled:
            open_ = [f"{label} {paired_ratio(samples[chosen], samples[label]).text()} the speed of {chosen}"
                     for label in verdicts.contenders]
            reasons.append(f"not separated after {rounds} rounds ({stop_reason}): {', '.join(open_)}; its interval "
                           f"reaches past {1 + MARGIN:g}x, so it may be up to that much faster")
    for label, fig in figures.items():
        if fig["out"]:
            reasons.append(f"{label} out: {fig['out']}")
    for label in samples:
        fig = figures[label]
        if fig["vs_fp32"]:
            r = fig["vs_fp32"]
            reasons.append(f"{label}: {r['value']:.2f}x fp32 ({r['low']:.2f}-{r['high']:.2f}), SQNR "
                           + ("exact" if fig["sqnr_db"] == math.inf else f"{fig['sqnr_db']:.1f} dB")
                           + (f", {fig['status']} than {incumbent}" if fig["status"] in ("faster", "slower") else
                              f", no gain over {incumbent}" if fig["status"] == "no gain" else
                              f", undecided against {incumbent}" if fig["status"] == "undecided" else ""))

    untried = [label for label, fig in figures.items() if (fig["out"] or "").startswith("not tried")]
    if untried and decided:
        decided = False  # a choice among the candidates that ran, not among all: measured again next time
        reasons.insert(0, f"undecided: {', '.join(untried)} not tried within the time limit ({time_limit:g} s); "
                          f"{chosen} kept among those that ran (give a longer time_limit)")
    kept = by_label[chosen]
    policy = kept.policy if kept.policy is not None else _untouched(name)
    policy = dataclasses.replace(policy, name=name)
    return Calibration(name, policy, chosen, "measured", decided, tuple(reasons),
                       tuple(figures[c.label] for c in cands), clock.name, rounds, round(now() - started, 3),
                       datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), hw.name, floor)



# --------------------------------------------------------------------------- apply with calibrate=


def apply(
    target: Any,
    policy: Policy | str,
    *,
    calibrate: Any = None,
    run: Callable[[Any], Any] | None = None,
    keep_original: str = "cpu",
    strict: bool = False,
    **calibration: Any,
) -> Applied:
    """Apply a policy or a preset to a module, a mapping of named modules, or a pipeline.

    ``policy`` may be a :class:`~mixprec.policy.Policy` or a preset's name (resolved for the
    model's device). With ``calibrate=example_inputs`` the preset is first checked on the
    model (:func:`calibrate`: its candidates timed on those inputs, the fastest that
    meets the preset's quality floor kept, the decision remembered); ``calibrate=True``
    uses a pipeline's own example inputs, and a :class:`Calibration` is applied as it is.
    Other keyword arguments go to :func:`calibrate` (``time_limit``, ``cache``,
    ``floor_db``, ``hints``). The returned :class:`~mixprec.casting.apply.Applied` carries
    the ``calibration``.

    Everything else is :func:`mixprec.casting.apply.apply`: revert restores every tensor
    bit-exactly.

    Examples:
        >>> with mixprec.apply(model, "fast", calibrate=(input_ids,)) as applied:
        ...     print(applied.calibration.headline())
        ...     model(input_ids)
    """
    found: Calibration | None = None
    if isinstance(calibrate, Calibration):
        found = calibrate
    elif calibrate is not None and calibrate is not False:
        if not isinstance(policy, str):
            raise ApplyError("calibrate= chooses among a preset's candidates: pass the preset's name (for example "
                             f"'fast') instead of a {type(policy).__name__}")
        found = _calibrate(target, policy, None if calibrate is True else calibrate, run=run, **calibration)
    elif calibration:
        raise ApplyError(f"{', '.join(sorted(calibration))}: options of calibrate=, which was not given")
    if found is not None:
        chosen = found.policy
    elif isinstance(policy, str):
        components, hints = components_of(target)
        chosen = resolve_preset(policy, hardware=probe(device_of(components)), hints=hints)
    else:
        chosen = policy
    applied = apply_policy(target, chosen, keep_original=keep_original, strict=strict)
    applied.calibration = found
    return applied
