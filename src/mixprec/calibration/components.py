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
6. **Check** (:mod:`~mixprec.calibration.endtoend`). The composed policy runs once, end to
   end, against fp32's output with the preset's floor. Where it misses, the component with
   the largest own error moves back to a safer option first, and the check runs again.
   Where time allows, paired whole runs against the rule-based policy close the decision.

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
from typing import Any, Callable

import torch

from mixprec.calibration.candidates import REFERENCE, candidates
from mixprec.calibration.decide import MARGIN, MIN_ROUNDS, Verdicts, compare
from mixprec.calibration.endtoend import PER_COMPONENT, EndToEnd, db
from mixprec.calibration.options import (Option, Part, candidate_figures, computes_fp32, eligible, freeze, option_for,
                                         options, part_row, predicted_ratio, recall, remember)
from mixprec.calibration.record import Recorder, Unit, replay, seconds_text
from mixprec.calibration.result import Calibration
from mixprec.calibration.trials import _applied, detached, output_quality, short
from mixprec.casting.targets import components_of
from mixprec.device.clock import Clock
from mixprec.device.hardware import Hardware
from mixprec.diagnose.capture import shared_model_memo
from mixprec.policy import Policy, Rule

__all__ = ["measure_components", "freeze", "PER_COMPONENT", "NEGLIGIBLE"]

#: Components under this share of the run's seconds are not timed.
NEGLIGIBLE = 0.02
#: An option slower than the leader by more than this in every one of two or more rounds leaves the rounds.
CLEARLY_SLOWER = 0.25
#: A component is timed through the modules it calls directly where its options' calls over the
#: rounds a verdict needs would take more than this share of the time left for rounds.
LONG_CALL_SHARE = 0.5


def measure_components(target: Any, run: Callable[[Any], Any], inputs: Any, name: str, hw: Hardware,
                       hints: tuple[str, ...], floor: float, clock: Clock, time_limit: float, max_rounds: int,
                       now: Callable[[], float], started: float, pipeline: bool, cache: bool | str) -> Calibration:
    """Calibrate ``name`` on ``target``'s components (see the module docstring)."""
    job = _PerComponent(target, run, name, hw, hints, floor, clock, time_limit, max_rounds, now, started, cache)
    job.record(inputs, pipeline)
    job.recall()
    job.first_calls()
    job.incumbents()
    job.rounds()
    job.choose()
    job.compose()
    job.check()
    job.confirm()
    return job.result()


class _PerComponent(EndToEnd):
    """One calibration made per component, its steps as methods, in the order :func:`measure_components` runs them."""

    def __init__(self, target: Any, run: Callable[[Any], Any], name: str, hw: Hardware, hints: tuple[str, ...],
                 floor: float, clock: Clock, time_limit: float, max_rounds: int, now: Callable[[], float],
                 started: float, cache: bool | str):
        self.target, self.run, self.name, self.hw, self.hints, self.floor = target, run, name, hw, hints, floor
        self.clock, self.time_limit, self.max_rounds, self.now, self.started = clock, time_limit, max_rounds, now, started
        self.cache = cache
        self.components = components_of(target)[0]
        self.cands = candidates(name, hw, hints)
        self.by_label = {c.label: c for c in self.cands}
        self.memo = shared_model_memo(self.components)
        self.reasons: list[str] = []
        self.verdicts: dict[str, Verdicts] = {}
        self.incumbent: dict[str, str] = {}
        self.pool: dict[str, list[str]] = {}
        self.n_rounds, self.stop_reason = 0, ""
        self.backed: list[str] = []
        self.check_sqnr: float | None = None
        self.check_s: float | None = None
        self.check_skipped = False

    # ----------------------------------------------------------------------- helpers

    def elapsed(self) -> float:
        return self.now() - self.started

    def timed(self) -> list[Part]:
        return [p for p in self.parts.values() if p.timed]

    def replay(self, unit: Unit, option: Option, index: int) -> tuple[Any, float]:
        sample = unit.samples[index % len(unit.samples)]
        return replay(sample, self.memo, option.dtype(unit.module), unit.min_ndim, self.clock)

    def estimate(self, part: Part, option: Option, index: int) -> float:
        """The component's seconds in the run, estimated from one recorded call of each unit."""
        total = part.residual_s
        for unit in part.units:
            sample = unit.samples[index % len(unit.samples)]
            _, seconds = self.replay(unit, option, index)
            total += seconds * unit.seconds / max(sample.seconds, 1e-9)
        return total

    def applied(self, parts: list[Part], policy: Policy | None) -> Any:
        """``policy`` applied to these components only (the others stay as they are)."""
        return _applied({p.name: self.components[p.name] for p in parts}, policy)

    def ratio_of(self, part: Part, label: str) -> float:
        """The median paired speed of ``label`` over fp32 on ``part``; from the first calls where the rounds
        did not time both; 1 where nothing timed it."""
        opt, base = part.options.get(label), part.options.get(REFERENCE)
        if opt is None or base is None:
            return 1.0
        if not opt.rounds or not base.rounds:
            return base.first_s / opt.first_s if opt.first_s > 0 and base.first_s > 0 else 1.0
        n = min(len(opt.rounds), len(base.rounds))
        return statistics.median(a / b for a, b in zip(base.rounds[:n], opt.rounds[:n]))

    def predicted(self, choice: dict[str, str]) -> float:
        """The run's seconds on the device clock with each component in its chosen option."""
        return sum(p.record.seconds / self.ratio_of(p, choice[c]) for c, p in self.parts.items())

    # ----------------------------------------------------------------------- 1. record

    def record(self, inputs: Any, pipeline: bool) -> None:
        recorder = Recorder(self.components, self.clock)
        begin = self.now()
        try:
            with recorder, torch.inference_mode():
                reference, self.reference_s = self.clock.time(lambda: self.run(inputs))
        except Exception as exc:
            raise ValueError(f"the fp32 model itself failed on the example inputs ({short(exc)}): calibrate needs "
                             "inputs the model runs on") from exc
        self.reference_wall = self.now() - begin
        # The device clock's seconds as wall seconds (CPU time counts every thread; CUDA events the kernels).
        self.wall_per_clock = self.reference_wall / self.reference_s if self.reference_s > 0 else 1.0
        self.pipeline = pipeline
        self.forced = self.target.teacher_forced(inputs, reference) if pipeline else inputs
        self.ref = detached(reference)
        per = options(self.components, self.cands)
        self.parts = {c: Part(c, self.components[c], recorder.records[c], per[c]) for c in self.components}
        self.total_s = sum(p.record.seconds for p in self.parts.values()) or 1e-9
        for part in self.parts.values():
            share = part.record.seconds / self.total_s
            if not part.record.samples:
                part.timed, part.note = False, ("not called in the run" if part.record.calls == 0 else
                                                "its calls' arguments could not be copied: not timed")
            elif share < NEGLIGIBLE:  # its own error is measured (a first call costs little), its speed is not
                part.negligible, part.note = True, f"{share:.1%} of the run: not timed"
            if len(part.options) == 1:
                only = next(iter(part.options))
                part.timed, part.kept, part.decided = False, only, True
                part.note = f"every candidate plans it alike ({only})"

    # ----------------------------------------------------------------------- 2. remembered components

    def recall(self) -> None:
        """Components decided before (by this model or another built from them): kept as remembered, untimed."""
        if self.cache:
            for part in self.parts.values():
                recall(part, self.name, self.hw, self.hints, self.floor, self.cache)

    def remember(self, decided: bool) -> None:
        if self.cache and decided:
            for part in self.parts.values():
                remember(part, self.name, self.hw, self.clock.name, self.n_rounds)

    # ----------------------------------------------------------------------- 3. first calls

    def choose_units(self, part: Part, rounds_budget: float) -> None:
        """Time the component's own calls, or (one call too long to repeat) the modules it calls directly."""
        record = part.record
        whole = record.whole()
        part.units, part.layers, part.residual_s = [whole], False, 0.0
        one_call = statistics.mean(s.seconds for s in whole.samples)
        children = record.child_units()
        per_round_children = sum(statistics.mean(s.seconds for s in u.samples) for u in children)
        too_long = one_call * self.wall_per_clock * len(part.options) * MIN_ROUNDS > LONG_CALL_SHARE * max(rounds_budget, 0.0)
        # A call returning no floating-point tensor (a decoding loop's tokens) cannot show its own error, and a
        # sampled loop may run another length in 16 bits: the modules it calls are timed and compared instead.
        opaque = not all(s.output for s in whole.samples)
        if children and ((too_long and per_round_children < 0.7 * one_call) or opaque):
            part.units, part.layers = children, True
            part.residual_s = max(0.0, record.seconds - sum(u.seconds for u in children))

    def first_calls(self) -> None:
        """Each option once on each unit's first recorded call: a warm-up, and the component's own error."""
        self.check_reserve = self.reference_wall  # the end-to-end check runs the whole model once
        budget = self.time_limit - self.elapsed() - self.check_reserve
        for part in self.timed():
            self.choose_units(part, budget)
            if REFERENCE in part.options:  # fp32's first calls were the recording's
                ref = part.options[REFERENCE]
                ref.sqnr_db = math.inf
                ref.first_s = part.residual_s + sum(u.seconds for u in part.units)
                ref.cost_s = sum(u.samples[0].seconds for u in part.units)
        for cand in self.cands:
            here = [p for p in self.timed() if cand.label in p.options and cand.label != REFERENCE]
            if not here:
                continue
            cost = self.wall_per_clock * sum(u.samples[0].seconds for p in here for u in p.units)
            if cand.label != "rules" and self.elapsed() + cost + self.check_reserve > self.time_limit:
                for p in here:
                    p.options[cand.label].out = f"not tried: the time limit ({self.time_limit:g} s) came first"
                continue
            try:
                with self.applied(here, cand.policy), torch.inference_mode():
                    for part in here:
                        self._first(part, part.options[cand.label])
            except Exception as exc:  # noqa: BLE001 - the candidate did not apply: out everywhere, said with its error
                for p in here:
                    p.options[cand.label].out = f"failed: {short(exc)}"
        # The end-to-end check will run at the fastest whole candidate's speed, as the first calls predict it.
        timed = self.timed()
        if timed:
            fp32_s = sum(p.record.seconds for p in timed)
            fastest = min((sum(o.first_s for p in timed for o in [p.options.get(c.label)] if o is not None and o.out is None)
                           / max(fp32_s, 1e-9) for c in self.cands), default=1.0)
            self.check_reserve = self.reference_wall * min(1.0, max(0.3, fastest))

    def _first(self, part: Part, option: Option) -> None:
        worst, bad, took, raw = math.inf, 0, part.residual_s, 0.0
        try:
            for unit in part.units:
                out, seconds = self.replay(unit, option, 0)
                took += seconds * unit.seconds / max(unit.samples[0].seconds, 1e-9)
                raw += seconds
                if unit.samples[0].output:  # a unit whose output holds no float (tokens) is checked end to end only
                    sqnr, nonfinite = output_quality(detached(out), unit.samples[0].output)
                    worst, bad = min(worst, sqnr), bad + nonfinite
        except Exception as exc:  # noqa: BLE001 - the option is out for this component, said with its error
            option.out = f"failed: {short(exc)}"
            return
        option.sqnr_db, option.first_s, option.cost_s = worst, took, raw
        if bad:
            option.out = f"{bad} non-finite values in {part.name}'s output"
        elif not worst >= self.floor:
            option.out = (f"own SQNR {worst:.1f} dB against fp32, below {self.name}'s floor of "
                          f"{self.floor:g} dB")

    # ----------------------------------------------------------------------- 4. rounds

    def incumbents(self) -> None:
        """Per component the option that stays unless beaten: its rules where they qualified, else fp32."""
        for part in self.timed():
            if part.negligible:
                part.timed = False
                continue
            allowed = [o.label for o in part.live() if eligible(o, self.name)]
            fp8 = next((o.label for o in part.live() if o.label == "rules-fp8"), None)
            if self.name == "memory" and fp8 is not None:  # memory's objective is weight bytes
                part.kept, part.decided, part.timed = fp8, True, False
                part.note = "memory's fp8 level met the floor on it: kept without timing (memory's objective is weight bytes)"
                continue
            rules = option_for(part, "rules")
            incumbent = (rules.label if rules is not None and rules.label in allowed else
                         REFERENCE if REFERENCE in allowed else allowed[0] if allowed else None)
            if incumbent is None:
                part.timed, part.note = False, "no option met the floor without an error: fp32 stays"
                part.kept = REFERENCE if REFERENCE in part.options else None
                continue
            self.incumbent[part.name] = incumbent
            if len(allowed) == 1:
                part.kept, part.decided, part.timed = incumbent, True, False
                part.note = f"only {incumbent} qualified: kept without timing"
        for part in self.timed():
            self.pool[part.name] = [o.label for o in part.live() if eligible(o, self.name) or o.label == REFERENCE]

    def rounds(self) -> None:
        """Paired interleaved rounds until every component settles, ``max_rounds``, or the time limit."""
        timed = self.timed()
        last = self.wall_per_clock * sum(p.options[label].cost_s for p in timed for label in self.pool[p.name])
        while True:
            active = [p for p in timed if len(self.pool[p.name]) > 1
                      and not (p.name in self.verdicts and self.verdicts[p.name].settled)]
            if not active:
                break
            if self.n_rounds >= self.max_rounds:
                self.stop_reason = f"the most rounds ({self.max_rounds})"
                break
            if self.elapsed() + last + self.check_reserve > self.time_limit:
                self.stop_reason = f"the time limit ({self.time_limit:g} s)"
                break
            begin = self.now()
            labels = [c.label for c in self.cands if any(c.label in self.pool[p.name] for p in active)]
            for label in (labels if self.n_rounds % 2 == 0 else labels[::-1]):
                here = [p for p in active if label in self.pool[p.name]]
                with self.applied(here, self.by_label[label].policy), torch.inference_mode():
                    for part in here:
                        part.options[label].rounds.append(self.estimate(part, part.options[label], self.n_rounds))
            self.n_rounds += 1
            last = self.now() - begin
            for part in active:
                self._judge(part)
        for part in timed:
            if len(self.pool[part.name]) == 1 and part.name not in self.verdicts:
                part.kept, part.decided = self.pool[part.name][0], True
                part.note = part.note or f"the other options left the rounds: {part.kept} kept"

    def _judge(self, part: Part) -> None:
        live = self.pool[part.name]
        samples = {label: part.options[label].rounds for label in live}
        n = min(len(v) for v in samples.values())
        if n >= 2:  # clearly slower than the leader in every round: out of the rounds
            leader = min(live, key=lambda label: statistics.median(samples[label]))
            for label in list(live):
                if label in (leader, self.incumbent[part.name]):
                    continue
                if all(a / b < 1 / (1 + CLEARLY_SLOWER) for a, b in zip(samples[leader][:n], samples[label][:n])):
                    live.remove(label)
                    part.options[label].left = (f"slower than {leader} in every one of {n} paired rounds "
                                                f"(by more than {CLEARLY_SLOWER:.0%}): left the rounds")
        if n >= MIN_ROUNDS:
            incumbent = self.incumbent[part.name]
            challengers = sorted((label for label in live if label != incumbent and eligible(part.options[label], self.name)),
                                 key=lambda label: self.by_label[label].simplicity)
            self.verdicts[part.name] = compare({label: part.options[label].rounds[:n] for label in live}, incumbent,
                                               challengers, quality={label: part.options[label].sqnr_db for label in live})

    # ----------------------------------------------------------------------- 5. choose and compose

    def choose(self) -> None:
        for part in self.parts.values():
            if part.kept is not None:
                continue
            v = self.verdicts.get(part.name)
            if v is not None:
                part.kept, part.decided = v.winner, True
                ratio = v.ratios.get(v.winner)
                part.verdict_text = (f"{ratio.text()} the speed of {v.incumbent}" if ratio is not None and v.winner != v.incumbent
                                     else "no option was supported faster")
                if not v.settled:
                    part.verdict_text += f"; not separated from {', '.join(v.contenders)} ({self.stop_reason})"
            elif part.name in self.incumbent:
                part.kept = self.incumbent[part.name]
                part.note = (f"undecided: {self.n_rounds} timed rounds before {self.stop_reason}, {MIN_ROUNDS} needed: "
                             f"{part.kept} stays")
        largest = max(self.parts.values(), key=lambda p: p.record.seconds)
        for part in self.parts.values():
            if part.kept is not None:
                continue
            # Not timed: follow the largest component where that qualifies here (no cast between them), else the rules.
            follow = option_for(part, largest.kept) if largest.kept else None
            if follow is not None and follow.out is None and eligible(follow, self.name) and (
                    follow.sqnr_db is None or follow.sqnr_db >= self.floor):
                part.kept = follow.label
                part.note = (part.note or "not timed") + f"; follows {largest.name} ({largest.kept})"
            else:
                rules = option_for(part, "rules")
                part.kept = rules.label if rules is not None else REFERENCE
                part.note = (part.note or "not timed") + f"; keeps {part.kept}"
            part.decided = True

    def policy_for(self, choice: dict[str, str]) -> tuple[Policy, str]:
        """The policy giving each component its chosen option: a candidate's own where one candidate is every
        choice, else the choices frozen into rules (:func:`~mixprec.calibration.options.freeze`)."""
        kept = {c: self.parts[c].options[choice[c]] for c in self.parts}
        for cand in self.cands:
            if all(option_for(self.parts[c], cand.label) is kept[c] for c in self.parts):
                policy = cand.policy if cand.policy is not None else Policy(
                    (Rule("*", storage="fp32", optional=True, reason=f"{self.name} calibrated: fp32 was fastest on this model"),),
                    None, name=self.name)
                return dataclasses.replace(policy, name=self.name), cand.label
        weights: dict[str, float] = {}  # the matmul level: that of the options computing most of the run in fp32
        for c, option in kept.items():
            if computes_fp32(option.plans):
                weights[option.level] = weights.get(option.level, 0.0) + self.parts[c].record.seconds
        level = max(weights, key=weights.__getitem__) if weights else "highest"
        return (freeze(self.components, {c: o.plans for c, o in kept.items()}, level, self.name, dict(choice)),
                PER_COMPONENT)

    def compose(self) -> None:
        self.choice = {c: p.kept for c, p in self.parts.items()}
        self.whole: dict[str, float] = {}
        for cand in self.cands:
            picks = {c: option_for(p, cand.label) for c, p in self.parts.items()}
            if all(o is not None and o.out is None and (o.sqnr_db is None or o.sqnr_db >= self.floor)
                   and eligible(o, self.name) for o in picks.values()):
                self.whole[cand.label] = self.predicted({c: o.label for c, o in picks.items()})
        self.composed_s = self.predicted(self.choice)
        self.policy, self.chosen = self.policy_for(self.choice)
        if self.chosen != PER_COMPONENT or self.name == "memory":  # memory's per-component fp8 choices stand
            return
        # Of the whole-model candidates predicted as fast, the simplest (the untouched model first).
        near = [label for label, s in self.whole.items() if s <= self.composed_s * (1 + MARGIN)]
        if not near:
            return
        best = max(near, key=lambda label: (self.by_label[label].simplicity, -self.whole[label]))
        self.reasons.append(f"{best} on every component is predicted as fast as the per-component choice "
                            f"({self.total_s / self.whole[best]:.2f}x against {self.total_s / self.composed_s:.2f}x fp32): "
                            "kept, as the simpler policy")
        self.choice = {c: option_for(p, best).label for c, p in self.parts.items()}
        self.policy, self.chosen = self.policy_for(self.choice)

    # ----------------------------------------------------------------------- 7. the result

    def component_rows(self) -> list[dict[str, Any]]:
        return [part_row(p, self.verdicts.get(p.name), self.total_s) for p in self.parts.values()]

    def figures(self) -> list[dict[str, Any]]:
        """Per whole-model candidate, its figures predicted from the components'; and the composition's."""
        return [*candidate_figures(self.cands, list(self.parts.values()), self.whole, self.total_s),
                {"label": PER_COMPONENT, "what": "each component's own choice, composed", "also": [], "eligible": True,
                 "sqnr_db": self.check_sqnr, "nonfinite": 0, "out": None, "weight_bytes": None,
                 "median_s": self.composed_s, "vs_fp32": predicted_ratio(self.total_s, self.composed_s), "status": None,
                 "predicted": True, "measured_s": self.check_s, "fp32_s": self.reference_s}]

    def result(self) -> Calibration:
        rows = self.component_rows()
        undecided = [p.name for p in self.parts.values()
                     if not p.decided and p.record.seconds / self.total_s >= NEGLIGIBLE]
        decided = not undecided and not self.check_skipped
        head = ["per component: " + ", ".join(
            f"{r['component']} {r['kept']}" + (f" ({_ratio_text(r['vs_fp32'])})" if r["vs_fp32"] else "") for r in rows)]
        if undecided:
            head.insert(0, f"undecided: {', '.join(undecided)} not decided within the time limit ({self.time_limit:g} s); "
                           "their rules stay (give a longer time_limit)")
        tail = []
        layered = [p.name for p in self.parts.values() if p.layers]
        if layered:
            tail.append("predicted: " + ", ".join(layered) + " timed through the modules each calls directly, on the "
                        "inputs they received, scaled to the run (one call was too long to repeat within the limit)")
        if self.check_sqnr is not None and self.chosen != REFERENCE:
            tail.append(f"checked end to end: {db(self.check_sqnr)} against fp32 (floor {self.floor:g} dB)"
                        + ("" if not self.check_s else
                           f", one teacher-forced run in {seconds_text(self.check_s)}" if self.pipeline else
                           f", one run in {seconds_text(self.check_s)} (predicted from the components: "
                           f"{seconds_text(self.predicted(self.choice))}) against fp32's {seconds_text(self.reference_s)}"))
        if self.backed:
            tail.append("moved back: " + ", ".join(self.backed))
        if getattr(self, "confirmed", None):
            tail.append(self.confirmed)
        self.remember(decided)
        return Calibration(self.name, dataclasses.replace(self.policy, name=self.name), self.chosen, "measured",
                           decided, tuple(head + self.reasons + tail), tuple(self.figures()), self.clock.name,
                           self.n_rounds, round(self.elapsed(), 3), _now(), self.hw.name, self.floor,
                           components=tuple(rows))


def _ratio_text(r: dict[str, Any]) -> str:
    return f"{r['value']:.2f}x fp32 ({r['low']:.2f}-{r['high']:.2f})"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
