"""The options of one component in a calibration made per component, and their composition.

A preset's candidate acts on one component as an :class:`Option`: the plan it gives each of
the component's modules (:func:`~mixprec.policy.select.resolve_modules`), its float32 matmul
level, and what the calibration measured of it there. Candidates that plan a component alike
(and, where it computes nothing in fp32, differ only in the matmul level) are one option
there. :func:`freeze` composes the options kept per component into one policy; a component's
decision is remembered as rules relative to the component (:func:`relative`,
:func:`absolute`), so that a component of another name, in another model, reuses it.
"""

from __future__ import annotations

import datetime
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from mixprec._json import number
from mixprec.calibration import cache as decisions
from mixprec.calibration.candidates import REFERENCE, Candidate
from mixprec.calibration.decide import Verdicts
from mixprec.calibration.record import ComponentRecord, Unit
from mixprec.casting.targets import DTYPES
from mixprec.device.hardware import Hardware
from mixprec.device.settings import NumericSettings
from mixprec.measure.stats import Ratio, paired_ratio
from mixprec.policy import Policy, Rule
from mixprec.policy.select import ModulePlan, resolve_modules

__all__ = ["Option", "Part", "options", "component_plans", "computes_fp32", "eligible", "freeze", "relative",
           "absolute", "recall", "remember", "part_row", "option_for", "candidate_figures", "predicted_ratio", "FIELDS"]

#: The fields of a module's plan that a composed rule sets.
FIELDS = ("storage", "compute", "keep_fp32", "upcast_attention", "output_dtype")


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
    #: Under :data:`~mixprec.calibration.components.NEGLIGIBLE` of the run: its own error measured, its speed not.
    negligible: bool = False
    note: str | None = None
    kept: str | None = None
    decided: bool = False
    source: str = "measured"
    verdict_text: str | None = None
    fields: dict[str, Any] | None = None

    def live(self) -> list[Option]:
        return [o for o in self.options.values() if o.out is None]


def plan_key(plan: ModulePlan) -> tuple:
    return tuple(getattr(plan, f) for f in FIELDS)


def _fp32_plan(name: str, module: nn.Module) -> ModulePlan:
    return ModulePlan(name, module)


def component_plans(components: dict[str, nn.Module], policy: Policy | None) -> dict[str, dict[int, ModulePlan]]:
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


def computes_fp32(plans: dict[int, ModulePlan]) -> bool:
    return any(p.compute_dtype == "fp32" for p in plans.values())


def options(components: dict[str, nn.Module], cands: list[Candidate]) -> dict[str, dict[str, Option]]:
    """Per component, the distinct options (see the module docstring, step 2)."""
    per: dict[str, dict[str, Option]] = {c: {} for c in components}
    keys: dict[str, dict[tuple, str]] = {c: {} for c in components}
    for cand in cands:
        level = cand.policy.numerics.matmul if cand.policy is not None and cand.policy.numerics is not None else "highest"
        by_component = component_plans(components, cand.policy)
        for c, root in components.items():
            plans = by_component[c]
            ordered = tuple(plan_key(plans[id(m)]) if id(m) in plans else None for m in root.modules())
            wrappers = cand.policy.wrappers if cand.policy is not None else "none"
            key = (ordered, wrappers, level if computes_fp32(plans) else "any")
            if key in keys[c]:
                per[c][keys[c][key]].also.append(cand.label)
            else:
                keys[c][key] = cand.label
                per[c][cand.label] = Option(cand.label, cand, plans, level)
    return per


def stores_low(option: Option) -> bool:
    return any(p.storage != "fp32" and not p.keep_fp32 for p in option.plans.values())


def eligible(option: Option, preset: str) -> bool:
    if preset == "memory":
        return stores_low(option)
    return option.cand is None or option.cand.eligible or option.remembered is not None


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
            key = plan_key(plan)
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


def relative(rules: tuple[Rule, ...], c: str) -> list[dict[str, Any]]:
    out = []
    for rule in rules:
        if rule.match == c or rule.match.startswith(c + "."):
            data = {f: getattr(rule, f) for f in FIELDS if getattr(rule, f) is not None}
            out.append(dict(data, match=rule.match[len(c):].lstrip(".")))
    return out


def absolute(data: list[dict[str, Any]], c: str, preset: str) -> tuple[Rule, ...]:
    return tuple(Rule(f"{c}.{d['match']}" if d["match"] else c, optional=True,
                      reason=f"{preset} calibrated per component: {c} as remembered",
                      **{f: d[f] for f in FIELDS if f in d}) for d in data)


def recall(part: Part, preset: str, hw: Hardware, hints: tuple[str, ...], floor: float, cache: bool | str) -> None:
    """Key ``part``'s decision (its structure, its first recorded call's inputs, the device, the versions) and,
    where one is remembered (``cache=True``), keep it: the part is then not timed."""
    if not part.record.samples:
        return
    sample = part.record.samples[0]
    prefix = part.name + "."
    own_hints = tuple(h[len(prefix):] for h in hints if h.startswith(prefix))
    part.fields = decisions.key_fields(preset, {"": part.root}, (sample.call.args, sample.call.kwargs), hw,
                                       hints=own_hints, floor_db=floor)
    part.fields["scope"] = "component"
    found = decisions.lookup(part.fields) if cache is True else None
    if found is None or found.get("rules") is None:
        return
    rules = absolute(found["rules"], part.name, preset)
    plans = component_plans({part.name: part.root}, Policy(rules, name=preset))[part.name]
    label = f"remembered {found.get('kept', '?')}"
    part.options = {label: Option(label, None, plans, found.get("level", "highest"),
                                  sqnr_db=number(found.get("sqnr_db")), remembered=rules)}
    part.kept, part.decided, part.timed, part.source = label, True, False, "cache"
    part.verdict_text = found.get("verdict")
    part.note = f"remembered from {found.get('when', '?')}: not timed"


def remember(part: Part, preset: str, hw: Hardware, clock: str, rounds: int) -> None:
    """Remember ``part``'s decision where it was measured now."""
    if (part.source != "measured" or part.negligible or part.fields is None or not part.units
            or part.kept not in part.options):  # a negligible part followed another: not a decision of its own
        return
    kept = part.options[part.kept]
    rules = freeze({part.name: part.root}, {part.name: kept.plans}, kept.level, preset, {part.name: part.kept}).rules
    decisions.store(part.fields, {"preset": preset, "scope": "component", "component": part.name, "chosen": part.kept,
                                  "kept": part.kept, "device": hw.name, "rules": relative(rules, part.name),
                                  "level": kept.level, "sqnr_db": "inf" if kept.sqnr_db == math.inf else kept.sqnr_db,
                                  "verdict": part.verdict_text, "clock": clock, "rounds": rounds,
                                  "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})


def part_row(part: Part, verdicts: Verdicts | None, total_s: float) -> dict[str, Any]:
    """What a calibration reports of one component (:attr:`mixprec.calibration.Calibration.components`)."""
    base = part.options.get(REFERENCE)
    opts = []
    for option in part.options.values():
        ratio = None
        if option.rounds and base is not None and base.rounds and option.label != REFERENCE:
            n = min(len(option.rounds), len(base.rounds))
            ratio = paired_ratio(base.rounds[:n], option.rounds[:n]).to_dict()
        status = (None if verdicts is None else "incumbent" if option.label == verdicts.incumbent
                  else verdicts.status.get(option.label))
        opts.append({"label": option.label, "also": list(option.also), "sqnr_db": option.sqnr_db,
                     "out": option.out or option.left, "vs_fp32": ratio, "status": status,
                     "median_s": statistics.median(option.rounds) if option.rounds else None})
    kept = next((o for o in opts if o["label"] == part.kept), None)
    return {"component": part.name, "calls": part.record.calls, "seconds": round(part.record.seconds, 6),
            "share": part.record.seconds / total_s, "unit": "layers (predicted)" if part.layers else "calls",
            "units": len(part.units), "kept": part.kept, "decided": part.decided, "source": part.source,
            "vs_fp32": kept["vs_fp32"] if kept else None, "sqnr_db": kept["sqnr_db"] if kept else None,
            "note": part.note, "verdict": part.verdict_text, "options": opts}


def option_for(part: Part, label: str) -> Option | None:
    """The option a candidate's label is on ``part`` (its own, or one it came out the same as)."""
    if label in part.options:
        return part.options[label]
    return next((o for o in part.options.values() if label in o.also), None)


def predicted_ratio(base: float, seconds: float | None) -> dict[str, Any] | None:
    """A speed predicted from the components (no interval: ``exact`` is false, ``n`` 0)."""
    if not seconds:
        return None
    value = base / seconds
    return Ratio(value, value, value, 0, exact=False).to_dict()


def candidate_figures(cands: list[Candidate], parts: list[Part], whole: dict[str, float], total_s: float) -> list[dict[str, Any]]:
    """Per whole-model candidate: its worst own error over the components, why it is out where it is, and its
    speed predicted from the components' (``whole``: the run's seconds where it qualified everywhere)."""
    figures = []
    for cand in cands:
        own = {p.name: option_for(p, cand.label) for p in parts}
        if not any(own.values()):
            continue
        pred = whole.get(cand.label)
        sq = [o.sqnr_db for o in own.values() if o is not None and o.sqnr_db is not None]
        figures.append({"label": cand.label, "what": cand.what, "also": list(cand.also), "eligible": cand.eligible,
                        "sqnr_db": min(sq) if sq else None, "nonfinite": 0,
                        "out": "; ".join(f"{c}: {o.out}" for c, o in own.items() if o is not None and o.out) or None,
                        "weight_bytes": None, "median_s": pred,
                        "vs_fp32": predicted_ratio(total_s, pred) if pred and cand.label != REFERENCE else None,
                        "status": None, "predicted": True})
    return figures
