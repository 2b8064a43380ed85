"""Resolving a policy over a model: which rule decides each field of each module.

A rule counts for a module when it matches the module or any ancestor; the last
counting rule that sets a field wins; a keep-fp32 pin (from a rule or from the
model's own declarations, :mod:`mixprec.policy.roles`) always wins.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from torch import nn

from mixprec.policy.roles import (Declaration, custom_norm_layers, declarations, dtype_sources, fp32_kernel, norm_layers,
                                  output_heads)
from mixprec._quote import quote
from mixprec.policy.rules import FP8_NAMES, RULE_FIELDS, Policy, nfc

__all__ = ["ModulePlan", "iter_modules", "resolve_modules", "closest_names", "UnmatchedRule", "UnmatchedRuleWarning",
           "unmatched_rules", "summarise_unmatched"]

#: Unmatched rules listed one by one; more are summarised in one line.
UNMATCHED_LISTED = 5
#: Unmatched rules whose closest module names are looked up (each look-up compares every name).
UNMATCHED_LOOKED_UP = 20



@dataclass
class ModulePlan:
    """The resolved precision of one module and the rule that decided each field."""

    qualname: str
    module: nn.Module
    storage: str = "fp32"
    compute: str = "native"
    keep_fp32: bool = False
    upcast_attention: bool = False
    output_dtype: str | None = None
    decided_by: dict[str, int] = field(default_factory=dict)
    #: The model's own declaration that pinned this module to fp32, if one did.
    declared: str | None = None
    #: The other names the module is reachable by (``self.dec = self.enc``): rules match them too.
    aliases: tuple[str, ...] = ()

    @property
    def compute_dtype(self) -> str:
        """The dtype this module's forward computes in (never an fp8 one: fp8 weights compute in bf16 natively)."""
        if self.keep_fp32:
            return "fp32"
        if self.compute != "native":
            return self.compute
        return "bf16" if self.storage in FP8_NAMES else self.storage

    @property
    def type_name(self) -> str:
        return type(self.module).__name__


def iter_modules(components: dict[str, nn.Module]) -> Iterator[tuple[str, nn.Module]]:
    """(qualified name, module) for every module of every component, parents first.

    A component registered under ``""`` (a bare model) contributes unprefixed names.
    """
    for cname, root in components.items():
        for name, module in root.named_modules():
            if cname and name:
                yield f"{cname}.{name}", module
            else:
                yield cname or name, module


def resolve_modules(components: dict[str, nn.Module], policy: Policy) -> tuple[list[ModulePlan], list[int]]:
    """Resolve every module's precision.

    A rule counts for a module when it matches the module or any ancestor; the
    counting rules are then applied in policy order, so the last one that sets a
    field wins, whether it matched the module itself or an ancestor.

    A module reachable under several names (``self.dec = self.enc``, a block shared by
    two parents) is one module with one plan: a rule matching any of its names counts
    for it and for everything under it, and rules that disagree are settled the same
    way (policy order; a keep-fp32 pin always wins). The plan's ``qualname`` is the first
    name ``named_modules`` gives; the others are its ``aliases``.

    Returns:
        (plans in ``named_modules`` order, indices of rules that matched nothing).
    """
    matched: set[int] = set()
    plans: list[ModulePlan] = []
    wanted = {r.role for r in policy.rules if r.role}
    roles = {role: finder(components) for role, finder in (("head", output_heads), ("norm", norm_layers),
                                                                   ("custom-norm", custom_norm_layers)) if role in wanted} \
        if wanted else None
    declared = declarations(components) if policy.model_declarations else []
    sources = dtype_sources(components) if policy.model_declarations else {}
    for cname, root in components.items():
        occurrences = [(_qualify(cname, name), module, parent) for name, module, parent in _occurrences(root)]
        own: dict[int, set[int]] = {}
        names: dict[int, list[str]] = {}
        for qualname, module, _ in occurrences:
            own.setdefault(id(module), set()).update(i for i, rule in enumerate(policy.rules)
                                                    if rule.matches(qualname, module, roles))
            names.setdefault(id(module), []).append(qualname)
        counting: dict[int, frozenset[int]] = {}
        for _, module, parent in occurrences:  # parents first; a parent seen again is followed by its subtree again
            counting[id(module)] = (counting.get(id(module), frozenset()) | own[id(module)]
                                    | (counting[id(parent)] if parent is not None else frozenset()))
        for name, module in root.named_modules():
            qualname = _qualify(cname, name)
            matched |= own[id(module)]
            rules = counting[id(module)]
            plan = ModulePlan(qualname, module, aliases=tuple(n for n in names[id(module)] if n != qualname))
            for index in sorted(rules):
                rule = policy.rules[index]
                for f in RULE_FIELDS:
                    value = getattr(rule, f)
                    if value is not None:
                        setattr(plan, f, value)
                        plan.decided_by[f] = index
            if not plan.keep_fp32:
                _apply_declarations(plan, declared)
            if not plan.keep_fp32 and plan.storage != "fp32" and id(module) in sources:
                plan.keep_fp32, plan.declared = True, sources[id(module)]
            if not plan.keep_fp32 and plan.compute_dtype != "fp32" and (kernel := fp32_kernel(module)) is not None:
                plan.keep_fp32, plan.declared = True, kernel
            if plan.keep_fp32:
                plan.storage = "fp32"
                if plan.declared is None:
                    plan.decided_by["storage"] = plan.decided_by["keep_fp32"]
            plans.append(plan)
    unmatched = [i for i, r in enumerate(policy.rules) if i not in matched and not r.optional]
    return plans, unmatched


def _apply_declarations(plan: ModulePlan, declared: list[Declaration]) -> None:
    """Pin ``plan`` to fp32 when a model it belongs to declares so for its storage dtype."""
    for decl in declared:
        if decl.owner and plan.qualname != decl.owner and not plan.qualname.startswith(decl.owner + "."):
            continue
        relative = plan.qualname[len(decl.owner) + 1:] if decl.owner else plan.qualname
        if plan.storage not in decl.storages or (decl.when_compute_fp32 and plan.compute != "fp32"):
            continue
        if decl.matches(relative):
            plan.keep_fp32 = True
            plan.declared = f"{decl.source} of {decl.owner or 'the model'}"
            return


def _qualify(cname: str, name: str) -> str:
    return (f"{cname}.{name}" if name else cname) if cname else name


def _occurrences(root: nn.Module) -> list[tuple[str, nn.Module, nn.Module | None]]:
    """(name, module, parent) for every name a module of ``root`` is reachable by, parents first
    (``named_modules(remove_duplicate=False)``, skipping a child that is its own ancestor)."""
    out: list[tuple[str, nn.Module, nn.Module | None]] = []
    stack: list[tuple[str, nn.Module, nn.Module | None, frozenset[int]]] = [("", root, None, frozenset({id(root)}))]
    while stack:
        name, module, parent, path = stack.pop()
        out.append((name, module, parent))
        children = [(f"{name}.{key}" if name else key, child) for key, child in module._modules.items()
                    if child is not None and id(child) not in path]
        stack.extend((child_name, child, module, path | {id(child)}) for child_name, child in reversed(children))
    return out


def closest_names(pattern: str, names: Iterable[str], n: int = 3) -> list[str]:
    """The module (or class) names closest to ``pattern``, compared in Unicode NFC."""
    return difflib.get_close_matches(nfc(pattern.removeprefix("type:")), [nfc(name) for name in names], n=n, cutoff=0.4)


class UnmatchedRuleWarning(UserWarning):
    """A policy rule that matches no module of the model it was applied to."""


@dataclass(frozen=True)
class UnmatchedRule:
    """A rule of a policy that matched no module.

    Attributes:
        index: the rule's position in the policy.
        match: its pattern.
        closest: the closest module or class names (looked up for the first
            :data:`UNMATCHED_LOOKED_UP` rules only; empty after those).
    """

    index: int
    match: str
    closest: tuple[str, ...] = ()

    def message(self) -> str:
        """``policy rule #3 'model.nett.2' matches no module; closest: 'model.net.2'``.

        Names are quoted as :func:`ascii` writes them, so a look-alike character (a
        Cyrillic ``е`` for a Latin ``e``) shows as an escape (``\\u0435``) beside its twin.
        """
        closest = ", ".join(quote(name) for name in self.closest) or "none"
        return f"policy rule #{self.index} {quote(self.match)} matches no module; closest: {closest}"

    def to_dict(self) -> dict[str, object]:
        return {"index": self.index, "match": self.match, "closest": list(self.closest)}


def unmatched_rules(plans: list[ModulePlan], policy: Policy, unmatched: list[int]) -> list[UnmatchedRule]:
    """The rules ``unmatched`` (indices from :func:`resolve_modules`) with the names closest to each."""
    names = [p.qualname for p in plans] + sorted({p.type_name for p in plans})
    return [UnmatchedRule(index, policy.rules[index].match,
                          tuple(closest_names(policy.rules[index].match, names)) if n < UNMATCHED_LOOKED_UP else ())
            for n, index in enumerate(unmatched)]


def summarise_unmatched(rules: list[UnmatchedRule], *, listed: int = UNMATCHED_LISTED) -> list[str]:
    """Lines that report ``rules``: one per rule up to ``listed`` of them; more are one
    line with their count and the first few (a policy written for another model may have
    thousands)."""
    if len(rules) <= listed:
        return [rule.message() for rule in rules]
    first = "; ".join(rule.message().removeprefix("policy ") for rule in rules[:listed])
    return [f"{len(rules):,} policy rules match no module (a typo, or a policy written for another model?); "
            f"the first {listed}: {first}; and {len(rules) - listed:,} more"]
