"""A preset calibrated per component: each component timed alone on its recorded calls.

A model of several components (a pipeline, a mapping of named modules) is calibrated in
these steps, all within the time limit:

1. **Record.** One fp32 run gives the reference output and, per component, its calls and
   their seconds on the device clock, with a sample of them kept (:mod:`~mixprec.calibration.record`).
   A decode step called 50 times weighs 50 times.
2. **Options.** The preset's candidates (:func:`~mixprec.calibration.candidates.candidates`:
   the rules, fp32, the one-line casts, the preset without its extras, fp8 under ``memory``)
   are resolved on each component; candidates that plan a component alike (and, where it
   computes nothing in fp32, differ only in the float32 matmul level) are one option there.
3. **First calls.** Each candidate is applied (to the components it is an option of) and
   each component's recorded calls are run again once: a warm-up, and the component's own
   error against the output fp32 gave on the same inputs (its SQNR). An option below the
   floor, with non-finite values or an error is out for that component.
4. **Rounds.** Paired, interleaved rounds: each round applies each live option and runs one
   recorded call of each unit (the samples in turn), so round ``i`` of two options ran under
   the same conditions. A component whose one call is too long to repeat within the limit
   is timed through the modules it calls directly (its layers and blocks, on the inputs
   they received), scaled to the run; its figure is then *predicted*. A component settles
   as :func:`~mixprec.calibration.decide.compare` settles; settled components leave the
   rounds, and an option slower than the leader by a clear margin in every round leaves early.
5. **Compose.** Each component keeps its fastest qualifying option (its rules where the
   rounds could not decide). The choices are frozen into one policy: a rule per component,
   and exact-name rules where a module's plan differs from its parent's. A whole-model
   candidate predicted as fast (within 2%) is kept instead: it is simpler.
6. **Check.** The composed policy runs once, end to end, against fp32's output with the
   preset's floor. Where it misses, the component with the largest own error goes back to
   fp32 first, and the check runs again.

Components that take under :data:`NEGLIGIBLE` of the run are not timed: they follow the
choice of the largest component where that qualifies on them (no extra cast between them),
else their rules. Each component's decision is remembered on its own
(:mod:`~mixprec.calibration.cache`, keyed by the component's structure, its recorded inputs,
the device and the versions): another model or pipeline built from the same component
reuses it without timing it.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from mixprec.calibration import cache as decisions
from mixprec.calibration.candidates import REFERENCE, Candidate, candidates
from mixprec.calibration.decide import MARGIN, MIN_ROUNDS, compare
from mixprec.calibration.record import ComponentRecord, Recorder, Unit, replay, seconds_text
from mixprec.calibration.result import Calibration
from mixprec.calibration.trials import _applied, detached, output_quality, short
from mixprec.casting.targets import DTYPES, components_of, weight_bytes
from mixprec.device.clock import Clock
from mixprec.device.hardware import Hardware
from mixprec.device.settings import NumericSettings
from mixprec.diagnose.capture import shared_model_memo
from mixprec.measure.stats import Ratio, paired_ratio
from mixprec.policy import Policy, Rule
from mixprec.policy.select import ModulePlan, resolve_modules

__all__ = ["measure_components", "freeze", "PER_COMPONENT", "NEGLIGIBLE"]

#: The label of a composed choice (components keeping different candidates).
PER_COMPONENT = "per-component"
#: Components under this share of the run's seconds are not timed.
NEGLIGIBLE = 0.02
#: An option slower than the leader by more than this in every one of two or more rounds leaves the rounds.
CLEARLY_SLOWER = 0.25
#: A component is timed through the modules it calls directly where its options' calls over the
#: rounds a verdict needs would take more than this share of the time left for rounds.
LONG_CALL_SHARE = 0.5
_FIELDS = ("storage", "compute", "keep_fp32", "upcast_attention", "output_dtype")


@dataclass
class Option:
    """A candidate as it acts on one component."""

    label: str
    cand: Candidate | None
    plans: dict[int, ModulePlan]
    level: str
    also: list[str] = field(default_factory=list)
    sqnr_db: float | None = None
    out: str | None = None
    #: Why it left the rounds early (clearly slower): still qualified, not timed further.
    left: str | None = None
    first_s: float = 0.0
    #: Seconds of one round's calls (one recorded call per unit), from the first calls.
    cost_s: float = 0.0
    #: Per round: the component's estimated seconds.
    rounds: list[float] = field(default_factory=list)
    remembered: tuple[Rule, ...] | None = None

    @property
    def policy(self) -> Policy | None:
        return self.cand.policy if self.cand is not None else None

    def dtype(self, module: nn.Module) -> torch.dtype:
        plan = self.plans.get(id(module))
        return DTYPES[plan.compute_dtype] if plan is not None else torch.float32


@dataclass
class Part:
    """One component in the calibration."""

    name: str
    root: nn.Module
    record: ComponentRecord
    options: dict[str, Option]
    units: list[Unit] = field(default_factory=list)
    residual_s: float = 0.0
    layers: bool = False
    timed: bool = True
    note: str | None = None
    kept: str | None = None
    decided: bool = False
    source: str = "measured"
    verdict_text: str | None = None
    fields: dict[str, Any] | None = None

    def live(self) -> list[Option]:
        return [o for o in self.options.values() if o.out is None]


def _plan_key(plan: ModulePlan) -> tuple:
    return tuple(getattr(plan, f) for f in _FIELDS)


def _fp32_plan(name: str, module: nn.Module) -> ModulePlan:
    return ModulePlan(name, module)


def _component_plans(components: dict[str, nn.Module], policy: Policy | None) -> dict[str, dict[int, ModulePlan]]:
    out: dict[str, dict[int, ModulePlan]] = {c: {} for c in components}
    owner = {id(m): c for c, root in components.items() for m in root.modules()}
    if policy is None:
        for c, root in components.items():
            for name, module in root.named_modules():
                out[c][id(module)] = _fp32_plan(f"{c}.{name}" if name else c, module)
        return out
    plans, _ = resolve_modules(components, policy)
    for plan in plans:
        c = owner.get(id(plan.module))
        if c is not None:
            out[c].setdefault(id(plan.module), plan)
    return out


def _computes_fp32(plans: dict[int, ModulePlan]) -> bool:
    return any(p.compute_dtype == "fp32" for p in plans.values())


def _options(components: dict[str, nn.Module], cands: list[Candidate]) -> dict[str, dict[str, Option]]:
    """Per component, the distinct options (see the module docstring, step 2)."""
    per: dict[str, dict[str, Option]] = {c: {} for c in components}
    keys: dict[str, dict[tuple, str]] = {c: {} for c in components}
    for cand in cands:
        level = cand.policy.numerics.matmul if cand.policy is not None and cand.policy.numerics is not None else "highest"
        by_component = _component_plans(components, cand.policy)
        for c, root in components.items():
            plans = by_component[c]
            ordered = tuple(_plan_key(plans[id(m)]) if id(m) in plans else None for m in root.modules())
            wrappers = cand.policy.wrappers if cand.policy is not None else "none"
            key = (ordered, wrappers, level if _computes_fp32(plans) else "any")
            if key in keys[c]:
                per[c][keys[c][key]].also.append(cand.label)
            else:
                keys[c][key] = cand.label
                per[c][cand.label] = Option(cand.label, cand, plans, level)
    return per


def _stores_low(option: Option) -> bool:
    return any(p.storage != "fp32" and not p.keep_fp32 for p in option.plans.values())


def _eligible(option: Option, preset: str) -> bool:
    if preset == "memory":
        return _stores_low(option)
    return option.cand is None or option.cand.eligible or option.remembered is not None


# --------------------------------------------------------------------------- timing


class _Runs:
    """Replays a part's units under an applied option."""

    def __init__(self, components: dict[str, nn.Module], clock: Clock):
        self.memo = shared_model_memo(components)
        self.clock = clock

    def unit(self, unit: Unit, option: Option, index: int) -> tuple[Any, float]:
        sample = unit.samples[index % len(unit.samples)]
        return replay(sample, self.memo, option.dtype(unit.module), unit.min_ndim, self.clock)

    def estimate(self, part: Part, option: Option, index: int) -> float:
        """The component's seconds in the run, estimated from one recorded call of each unit."""
        total = part.residual_s
        for unit in part.units:
            sample = unit.samples[index % len(unit.samples)]
            _, seconds = self.unit(unit, option, index)
            total += seconds * unit.seconds / max(sample.seconds, 1e-9)
        return total


def _subset(components: dict[str, nn.Module], names: list[str]) -> dict[str, nn.Module]:
    return {c: components[c] for c in names}


def _choose_units(part: Part, options: int, rounds_budget: float, wall_per_clock: float) -> None:
    """Time the component's own calls, or (one call too long to repeat) the modules it calls directly."""
    record = part.record
    whole = record.whole()
    part.units, part.layers, part.residual_s = [whole], False, 0.0
    if not whole.samples:
        return
    one_call = statistics.mean(s.seconds for s in whole.samples)
    children = record.child_units()
    per_round_children = sum(statistics.mean(s.seconds for s in u.samples) for u in children)
    too_long = one_call * wall_per_clock * options * MIN_ROUNDS > LONG_CALL_SHARE * max(rounds_budget, 0.0)
    if too_long and children and per_round_children < 0.7 * one_call:
        part.units, part.layers = children, True
        part.residual_s = max(0.0, record.seconds - sum(u.seconds for u in children))


# --------------------------------------------------------------------------- composition


def freeze(components: dict[str, nn.Module], chosen: dict[str, dict[int, ModulePlan]], level: str, preset: str,
           labels: dict[str, str]) -> Policy:
    """One policy giving each component the plans of its chosen option: a rule per component, and
    exact-name rules where a module's plan differs from its parent's."""
    rules: list[Rule] = []
    for c, root in components.items():
        plans = chosen[c]
        parents: dict[int, tuple] = {}
        for name, module in root.named_modules():
            plan = plans.get(id(module))
            if plan is None:
                continue
            key = _plan_key(plan)
            parent = root if not name else root.get_submodule(name.rpartition(".")[0]) if "." in name else root
            if name and parents.get(id(parent)) == key:
                parents[id(module)] = key
                continue
            parents[id(module)] = key
            qual = f"{c}.{name}" if name else c
            rules.append(Rule(qual, storage=plan.storage, compute=plan.compute,
                              keep_fp32=True if plan.keep_fp32 else None,
                              upcast_attention=plan.upcast_attention, output_dtype=plan.output_dtype, optional=True,
                              reason=f"{preset} calibrated per component: {c} keeps {labels[c]}"))
    numerics = NumericSettings(matmul=level) if level != "highest" else None
    return Policy(tuple(rules), numerics, name=preset)


def _relative(rules: tuple[Rule, ...], c: str) -> list[dict[str, Any]]:
    out = []
    for rule in rules:
        if rule.match == c or rule.match.startswith(c + "."):
            data = {f: getattr(rule, f) for f in _FIELDS if getattr(rule, f) is not None}
            out.append(dict(data, match=rule.match[len(c):].lstrip(".")))
    return out


def _absolute(data: list[dict[str, Any]], c: str, preset: str) -> tuple[Rule, ...]:
    return tuple(Rule(f"{c}.{d['match']}" if d["match"] else c, optional=True,
                      reason=f"{preset} calibrated per component: {c} as remembered",
                      **{f: d[f] for f in _FIELDS if f in d}) for d in data)


# --------------------------------------------------------------------------- the calibration


def measure_components(target: Any, run: Callable[[Any], Any], inputs: Any, name: str, hw: Hardware,
                       hints: tuple[str, ...], floor: float, clock: Clock, time_limit: float, max_rounds: int,
                       now: Callable[[], float], started: float, pipeline: bool, cache: bool | str) -> Calibration:
    """Calibrate ``name`` on ``target``'s components (see the module docstring)."""
    components, _ = components_of(target)
    cands = candidates(name, hw, hints)
    by_label = {c.label: c for c in cands}
    recorder = Recorder(components, clock)
    begin = now()
    try:
        with recorder, torch.inference_mode():
            reference, reference_s = clock.time(lambda: run(inputs))
    except Exception as exc:
        raise ValueError(f"the fp32 model itself failed on the example inputs ({short(exc)}): calibrate needs inputs "
                         "the model runs on") from exc
    reference_wall = now() - begin
    # The device clock's seconds as wall seconds (CPU time counts every thread; a GPU's events its kernels).
    wall_per_clock = reference_wall / reference_s if reference_s > 0 else 1.0
    forced = target.teacher_forced(inputs, reference) if pipeline else inputs
    ref = detached(reference)
    del reference
    reasons: list[str] = []

    options = _options(components, cands)
    total_s = sum(r.seconds for r in recorder.records.values()) or 1e-9
    parts = {c: Part(c, components[c], recorder.records[c], options[c]) for c in components}
    for part in parts.values():
        share = part.record.seconds / total_s
        if not part.record.samples:
            part.timed, part.note = False, ("not called in the run" if part.record.calls == 0 else
                                            "its calls' arguments could not be copied: not timed")
        elif share < NEGLIGIBLE:
            part.timed, part.note = False, f"{share:.1%} of the run: not timed"
        if len(part.options) == 1:
            only = next(iter(part.options))
            part.timed, part.kept, part.decided = False, only, True
            part.note = f"every candidate plans it alike ({only})"

    # Remembered components are kept as they were decided, untimed.
    if cache:
        for part in parts.values():
            if not part.record.samples:
                continue
            sample = part.record.samples[0]
            prefix = part.name + "."
            own_hints = tuple(h[len(prefix):] for h in hints if h.startswith(prefix))
            part.fields = decisions.key_fields(name, {"": part.root}, (sample.call.args, sample.call.kwargs), hw,
                                               hints=own_hints, floor_db=floor)
            part.fields["scope"] = "component"
            found = decisions.lookup(part.fields) if cache is True else None
            if found is not None and found.get("rules") is not None:
                rules = _absolute(found["rules"], part.name, name)
                plans = _component_plans({part.name: part.root}, Policy(rules, name=name))[part.name]
                label = f"remembered {found.get('kept', '?')}"
                part.options = {label: Option(label, None, plans, found.get("level", "highest"), sqnr_db=found.get("sqnr_db"),
                                              remembered=rules)}
                part.kept, part.decided, part.timed, part.source = label, True, False, "cache"
                part.verdict_text = found.get("verdict")
                part.note = f"remembered from {found.get('when', '?')}: not timed"

    runs = _Runs(components, clock)
    check_reserve = reference_wall  # the end-to-end check runs the whole model once
    timed = [p for p in parts.values() if p.timed]
    rounds_budget = time_limit - (now() - started) - check_reserve
    for part in timed:
        _choose_units(part, len(part.options), rounds_budget, wall_per_clock)

    # First calls: warm-up and own error, one candidate applied at a time (fp32's are the recording's).
    for part in timed:
        if REFERENCE in part.options:
            part.options[REFERENCE].sqnr_db = math.inf
            part.options[REFERENCE].first_s = sum(u.samples[0].seconds * u.seconds / max(u.samples[0].seconds, 1e-9)
                                                  for u in part.units) + part.residual_s
            part.options[REFERENCE].cost_s = sum(u.samples[0].seconds for u in part.units)
    for cand in cands:
        label = cand.label
        here = [p for p in timed if label in p.options and label != REFERENCE]
        if not here:
            continue
        cost = wall_per_clock * sum(u.samples[0].seconds for p in here for u in p.units)
        if label != "rules" and now() - started + cost + check_reserve > time_limit:
            for p in here:
                p.options[label].out = f"not tried: the time limit ({time_limit:g} s) came first"
            continue
        try:
            with _applied(_subset(components, [p.name for p in here]), cand.policy):
                with torch.inference_mode():
                    for part in here:
                        option = part.options[label]
                        worst, bad, took, raw = math.inf, 0, part.residual_s, 0.0
                        try:
                            for unit in part.units:  # the first recorded call of each unit
                                out, seconds = runs.unit(unit, option, 0)
                                took += seconds * unit.seconds / max(unit.samples[0].seconds, 1e-9)
                                raw += seconds
                                sqnr, nonfinite = output_quality(detached(out), unit.samples[0].output)
                                worst, bad = min(worst, sqnr), bad + nonfinite
                        except Exception as exc:  # noqa: BLE001 - the option is out for this component, said with its error
                            option.out = f"failed: {short(exc)}"
                            continue
                        option.sqnr_db, option.first_s, option.cost_s = worst, took, raw
                        if bad:
                            option.out = f"{bad} non-finite values in {part.name}'s output"
                        elif not worst >= floor:
                            option.out = f"{part.name}'s own SQNR {worst:.1f} dB against fp32, below {name}'s floor of {floor:g} dB"
        except Exception as exc:  # noqa: BLE001 - the candidate did not apply: out everywhere
            for p in here:
                p.options[label].out = f"failed: {short(exc)}"
    # The end-to-end check runs the fastest whole candidate's speed, as the first calls predict it.
    if timed:
        fastest = min((sum(o.first_s for p in timed for o in [p.options.get(c.label)] if o is not None and o.out is None)
                       / max(sum(p.record.seconds for p in timed), 1e-9) for c in cands), default=1.0)
        check_reserve = reference_wall * min(1.0, max(0.3, fastest))

    # Incumbents: the rules where they qualified, else fp32.
    incumbents: dict[str, str] = {}
    for part in timed:
        eligible = [o.label for o in part.live() if _eligible(o, name)]
        fp8 = next((o.label for o in part.live() if o.label == "rules-fp8"), None)
        if name == "memory" and fp8 is not None:  # memory's objective is weight bytes: its fp8 level wins where it holds
            part.kept, part.decided, part.timed = fp8, True, False
            part.note = "memory's fp8 level met the floor on it: kept without timing (memory's objective is weight bytes)"
            continue
        rules = next((o.label for o in part.options.values() if "rules" in (o.label, *o.also)), None)
        incumbent = rules if rules in eligible else (REFERENCE if REFERENCE in eligible else (eligible[0] if eligible else None))
        if incumbent is None:
            part.timed, part.note = False, "no option met the floor without an error: fp32 stays"
            part.kept = REFERENCE if REFERENCE in part.options else None
            continue
        incumbents[part.name] = incumbent
        if len(eligible) == 1:
            part.kept, part.decided, part.timed = incumbent, True, False
            part.note = f"only {incumbent} qualified: kept without timing"

    # Rounds.
    timed = [p for p in timed if p.timed]
    pool = {p.name: [o.label for o in p.live() if _eligible(o, name) or o.label == REFERENCE] for p in timed}
    rounds, stop_reason, last_round = 0, None, 0.0
    last_round = wall_per_clock * sum(p.options[label].cost_s for p in timed for label in pool[p.name])
    verdicts: dict[str, Any] = {}
    while True:
        active = [p for p in timed if len(pool[p.name]) > 1 and not (p.name in verdicts and verdicts[p.name].settled)]
        if not active:
            break
        if rounds >= max_rounds:
            stop_reason = f"the most rounds ({max_rounds})"
            break
        if now() - started + last_round + check_reserve > time_limit:
            stop_reason = f"the time limit ({time_limit:g} s)"
            break
        begin = now()
        labels = [c.label for c in cands if any(c.label in pool[p.name] for p in active)]
        for label in (labels if rounds % 2 == 0 else labels[::-1]):
            here = [p for p in active if label in pool[p.name]]
            with _applied(_subset(components, [p.name for p in here]), by_label[label].policy), torch.inference_mode():
                for part in here:
                    part.options[label].rounds.append(runs.estimate(part, part.options[label], rounds))
        rounds += 1
        last_round = now() - begin
        for part in active:
            live = pool[part.name]
            samples = {label: part.options[label].rounds for label in live}
            n = min(len(v) for v in samples.values())
            if n >= 2:  # clearly slower than the leader in every round: out of the rounds
                leader = min(live, key=lambda label: statistics.median(samples[label]))
                for label in list(live):
                    if label in (leader, incumbents[part.name]):
                        continue
                    if all(a / b < 1 / (1 + CLEARLY_SLOWER) for a, b in zip(samples[leader][:n], samples[label][:n])):
                        live.remove(label)
                        part.options[label].left = (f"slower than {leader} in every one of {n} paired rounds "
                                                   f"(by more than {CLEARLY_SLOWER:.0%}): left the rounds")
            if n >= MIN_ROUNDS:
                incumbent = incumbents[part.name]
                challengers = sorted((label for label in live if label != incumbent and
                                      _eligible(part.options[label], name)),
                                     key=lambda label: by_label[label].simplicity)
                verdicts[part.name] = compare({label: part.options[label].rounds[:n] for label in live}, incumbent,
                                              challengers, quality={label: part.options[label].sqnr_db for label in live})
    for part in timed:
        if len(pool[part.name]) == 1 and part.name not in verdicts:
            part.kept, part.decided = pool[part.name][0], True
            part.note = part.note or f"the other options left the rounds: {part.kept} kept"

    # Each component's choice.
    for part in parts.values():
        if part.kept is not None:
            continue
        if part.name in verdicts:
            v = verdicts[part.name]
            part.kept, part.decided = v.winner, True
            ratio = v.ratios.get(v.winner)
            part.verdict_text = (f"{ratio.text()} the speed of {v.incumbent}" if ratio is not None and v.winner != v.incumbent
                                 else "no option was supported faster")
            if not v.settled:
                part.verdict_text += f"; not separated from {', '.join(v.contenders)} ({stop_reason})"
        elif part.name in incumbents:
            part.kept = incumbents[part.name]
            if part.timed:
                part.note = (f"undecided: {rounds} timed rounds before {stop_reason}, {MIN_ROUNDS} needed: "
                             f"{part.kept} stays")
    largest = max(parts.values(), key=lambda p: p.record.seconds)
    for part in parts.values():
        if part.kept is None:  # not timed: follow the largest component where that qualifies here
            follow = largest.kept
            option = part.options.get(follow) if follow else None
            if option is None and follow:
                option = next((o for o in part.options.values() if follow in o.also), None)
            if option is not None and option.out is None and _eligible(option, name) and (
                    option.sqnr_db is None or option.sqnr_db >= floor):
                part.kept = option.label
                part.note = (part.note or "not timed") + f"; follows {largest.name} ({follow})"
            else:
                rules = next((o.label for o in part.options.values() if "rules" in (o.label, *o.also)), REFERENCE)
                part.kept = rules
                part.note = (part.note or "not timed") + f"; keeps {rules}"
            part.decided = True

    # Compose, prefer a whole-model candidate predicted as fast, check end to end.
    fp32_s = {p.name: p.record.seconds for p in parts.values()}

    def ratio_of(part: Part, label: str) -> float:
        opt = part.options.get(label)
        base = part.options.get(REFERENCE)
        if opt is None or base is None or not opt.rounds or not base.rounds:
            return 1.0
        n = min(len(opt.rounds), len(base.rounds))
        return statistics.median(a / b for a, b in zip(base.rounds[:n], opt.rounds[:n]))

    def option_for(part: Part, label: str) -> Option | None:
        if label in part.options:
            return part.options[label]
        return next((o for o in part.options.values() if label in o.also), None)

    def predicted(choice: dict[str, str]) -> float:
        return sum(fp32_s[c] / ratio_of(parts[c], choice[c]) for c in parts)

    choice = {c: p.kept for c, p in parts.items()}
    whole: dict[str, float] = {}
    for cand in cands:
        picks = {c: option_for(p, cand.label) for c, p in parts.items()}
        if all(o is not None and o.out is None and (o.sqnr_db is None or o.sqnr_db >= floor) and _eligible(o, name)
               for o in picks.values()):
            whole[cand.label] = predicted({c: o.label for c, o in picks.items()})
    composed_s = predicted(choice)

    def policy_for(choice: dict[str, str]) -> tuple[Policy, str]:
        labels = {c: choice[c] for c in parts}
        firsts = [cand.label for cand in cands if all(option_for(parts[c], cand.label) is parts[c].options[labels[c]]
                                                     for c in parts)]
        if firsts:
            cand = by_label[firsts[0]]
            policy = cand.policy if cand.policy is not None else Policy(
                (Rule("*", storage="fp32", optional=True, reason=f"{name} calibrated: fp32 was fastest on this model"),),
                None, name=name)
            return dataclasses.replace(policy, name=name), firsts[0]
        weights: dict[str, float] = {}
        for c in parts:
            option = parts[c].options[labels[c]]
            if _computes_fp32(option.plans):
                weights[option.level] = weights.get(option.level, 0.0) + fp32_s[c]
        level = max(weights, key=weights.get) if weights else "highest"
        return freeze(components, {c: parts[c].options[labels[c]].plans for c in parts}, level, name, labels), PER_COMPONENT

    policy, chosen = policy_for(choice)
    if whole and name != "memory":  # memory's objective is weight bytes: its per-component fp8 choices stand
        # Of the whole-model candidates predicted as fast, the simplest (the untouched model first).
        near = [label for label in whole if whole[label] <= composed_s * (1 + MARGIN)]
        best = max(near, key=lambda label: (by_label[label].simplicity, -whole[label])) if near else None
        if chosen == PER_COMPONENT and best is not None:
            base = sum(fp32_s.values())
            reasons.append(f"{best} on every component is predicted as fast as the per-component choice "
                           f"({base / whole[best]:.2f}x against {base / composed_s:.2f}x fp32): kept, as the simpler policy")
            choice = {c: option_for(parts[c], best).label for c in parts}
            policy, chosen = policy_for(choice)

    check_sqnr: float | None = None
    check_s: float | None = None
    check_skipped = False
    backed: list[str] = []
    while True:
        if chosen == REFERENCE:
            check_sqnr = math.inf
            break
        expected = reference_wall * min(1.0, predicted(choice) / max(sum(fp32_s.values()), 1e-9)) * 1.1
        if now() - started + expected > time_limit:  # the 10% over the limit is the estimate's slack
            if backed:  # a composition missed the floor: fp32 is the one choice known to meet it
                reasons.append(f"not checked end to end again: the time limit ({time_limit:g} s) came first; fp32 stays, "
                               "the one choice known to meet the floor")
                choice = {c: REFERENCE if REFERENCE in parts[c].options else choice[c] for c in parts}
                policy, chosen = policy_for(choice)
                check_sqnr, check_skipped = None, True
            else:
                reasons.append(f"not checked end to end: the time limit ({time_limit:g} s) came first; the rule-based "
                               "choice stays")
                policy, chosen = dataclasses.replace(by_label["rules"].policy, name=name), "rules"
                check_sqnr, check_skipped = None, True
            break
        try:
            with _applied(target, policy), torch.inference_mode():
                out, check_s = clock.time(lambda: run(forced))
                check_sqnr, bad = output_quality(detached(out), ref)
        except Exception as exc:  # noqa: BLE001 - the composition fails: back to the rules, said with its error
            reasons.append(f"the composed policy failed end to end ({short(exc)}): the rule-based choice stays")
            policy, chosen, check_sqnr = dataclasses.replace(by_label["rules"].policy, name=name), "rules", None
            break
        if not bad and check_sqnr >= floor:
            break
        movable = [p for p in parts.values() if choice[p.name] != REFERENCE and REFERENCE in p.options]
        if not movable:
            break
        # The largest own error first; a component not timed (its own error unknown) after those measured.
        worst = min(movable, key=lambda p: (p.options[choice[p.name]].sqnr_db is None,
                                            p.options[choice[p.name]].sqnr_db or 0.0, -p.record.seconds))
        backed.append(f"{worst.name} ({choice[worst.name]})")
        reasons.append(f"end to end {check_sqnr:.1f} dB{f' with {bad} non-finite values' if bad else ''}, below "
                       f"{name}'s floor of {floor:g} dB: {worst.name}, the largest own error, goes back to fp32")
        choice[worst.name] = REFERENCE
        worst.kept = REFERENCE
        policy, chosen = policy_for(choice)

    # Figures.
    comp_rows = []
    for part in parts.values():
        kept = part.options.get(part.kept) if part.kept else None
        opts = []
        for option in part.options.values():
            ratio = None
            base = part.options.get(REFERENCE)
            if option.rounds and base is not None and base.rounds and option.label != REFERENCE:
                n = min(len(option.rounds), len(base.rounds))
                if n:
                    ratio = paired_ratio(base.rounds[:n], option.rounds[:n]).to_dict()
            status = None
            v = verdicts.get(part.name)
            if v is not None:
                status = "incumbent" if option.label == v.incumbent else v.status.get(option.label)
            opts.append({"label": option.label, "also": list(option.also), "sqnr_db": option.sqnr_db,
                         "out": option.out or option.left,
                         "vs_fp32": ratio, "status": status, "median_s": statistics.median(option.rounds) if option.rounds else None})
        kept_fig = next((o for o in opts if kept is not None and o["label"] == kept.label), None)
        comp_rows.append({
            "component": part.name, "calls": part.record.calls, "seconds": round(part.record.seconds, 6),
            "share": part.record.seconds / total_s, "unit": "layers (predicted)" if part.layers else "calls",
            "units": len(part.units), "kept": part.kept, "decided": part.decided, "source": part.source,
            "vs_fp32": kept_fig["vs_fp32"] if kept_fig else None,
            "sqnr_db": kept.sqnr_db if kept is not None else None, "note": part.note, "verdict": part.verdict_text,
            "options": opts})

    base_total = sum(fp32_s.values())
    figures = []
    for cand in cands:
        if cand.label not in whole and not any(option_for(p, cand.label) for p in parts.values()):
            continue
        pred = whole.get(cand.label)
        own = [option_for(p, cand.label) for p in parts.values()]
        outs = [f"{p.name}: {o.out}" for p, o in zip(parts.values(), own) if o is not None and o.out]
        sq = [o.sqnr_db for o in own if o is not None and o.sqnr_db is not None]
        figures.append({"label": cand.label, "what": cand.what, "also": list(cand.also), "eligible": cand.eligible,
                        "sqnr_db": min(sq) if sq else None, "nonfinite": 0, "out": "; ".join(outs) or None,
                        "weight_bytes": None, "median_s": pred,
                        "vs_fp32": _predicted_ratio(base_total, pred) if pred and cand.label != REFERENCE else None,
                        "status": None, "predicted": True})
    figures.append({"label": PER_COMPONENT, "what": "each component's own choice, composed", "also": [], "eligible": True,
                    "sqnr_db": check_sqnr, "nonfinite": 0, "out": None, "weight_bytes": None, "median_s": composed_s,
                    "vs_fp32": _predicted_ratio(base_total, composed_s), "status": None, "predicted": True,
                    "measured_s": check_s, "fp32_s": reference_s})

    timed_parts = [p for p in parts.values() if p.units]
    undecided = [p.name for p in parts.values() if not p.decided and p.record.seconds / total_s >= NEGLIGIBLE]
    decided = not undecided and not check_skipped and (check_sqnr is not None or chosen == REFERENCE)
    reasons.insert(0, "per component: " + ", ".join(
        f"{p.name} {p.kept}" + (f" ({_ratio_text(r['vs_fp32'])})" if (r := _row(comp_rows, p.name))['vs_fp32'] else "")
        for p in parts.values()))
    if undecided:
        reasons.insert(0, f"undecided: {', '.join(undecided)} not decided within the time limit ({time_limit:g} s); "
                          "their rules stay (give a longer time_limit)")
    if any(p.layers for p in timed_parts):
        reasons.append("predicted: " + ", ".join(p.name for p in timed_parts if p.layers) + " timed through the modules "
                       "each calls directly, on the inputs they received, scaled to the run (one call was too long to "
                       "repeat within the limit)")
    if check_sqnr is not None and chosen != REFERENCE:
        reasons.append(f"checked end to end: {'exact' if check_sqnr == math.inf else f'{check_sqnr:.1f} dB'} against fp32 "
                       f"(floor {floor:g} dB)" + (f", one run in {seconds_text(check_s)} against fp32's {seconds_text(reference_s)}"
                                                   if check_s else ""))
    if backed:
        reasons.append("moved back to fp32: " + ", ".join(backed))
    for part in parts.values():
        if part.source == "measured" and part.fields is not None and part.decided and part.kept is not None and cache \
                and part.timed and decided:
            kept = part.options[part.kept]
            rules = freeze({part.name: part.root}, {part.name: kept.plans}, kept.level, name, {part.name: part.kept}).rules
            decisions.store(part.fields, {"preset": name, "scope": "component", "chosen": part.kept, "device": hw.name,
                                          "kept": part.kept, "rules": _relative(rules, part.name), "level": kept.level,
                                          "sqnr_db": kept.sqnr_db if kept.sqnr_db != math.inf else "inf",
                                          "verdict": part.verdict_text, "when": _now(), "clock": clock.name,
                                          "rounds": rounds, "component": part.name})
    policy = dataclasses.replace(policy, name=name)
    return Calibration(name, policy, chosen, "measured", decided, tuple(reasons), tuple(figures), clock.name, rounds,
                       round(now() - started, 3), _now(), hw.name, floor, components=tuple(comp_rows))


def _row(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(r for r in rows if r["component"] == name)


def _ratio_text(r: dict[str, Any]) -> str:
    return f"{r['value']:.2f}x fp32 ({r['low']:.2f}-{r['high']:.2f})"


def _predicted_ratio(base: float, seconds: float | None) -> dict[str, Any] | None:
    if not seconds:
        return None
    value = base / seconds
    return Ratio(value, value, value, 0, exact=False).to_dict()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def weight_total(components: dict[str, nn.Module]) -> int:
    return weight_bytes(components)
