"""What the search measures and records: a point of the search space (:class:`Config`), its
measurement (:class:`Evaluation`), a :class:`Candidate` on the search path, and the
:func:`frontier` of a path.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from mixprec.device.settings import NumericSettings
from mixprec.policy import CompileSettings, Policy, Rule

__all__ = ["Candidate", "Config", "Evaluation", "dominates", "frontier"]


@dataclass(frozen=True)
class Evaluation:
    """One measured policy.

    Attributes:
        latency_s: median seconds of the timed runs (first seed).
        memory_bytes: bytes of parameters and buffers under the policy.
        quality: worst case over the seeds of each quality metric.
        per_seed: seed -> quality on that seed (empty for a measurement reused from a
            store, which keeps the worst case only).
    """

    latency_s: float
    memory_bytes: float
    quality: dict[str, float]
    per_seed: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)


@dataclass
class Candidate:
    """One evaluated policy on the search path.

    Attributes:
        index: position on the path.
        step: what the search was doing (``baseline``, ``all-bf16``, ``bisect``, ``local: ...``).
        policy: the policy.
        evaluation: its measurement.
        met: whether it meets the bound.
        miss: how far it is from the bound (0 when met).
        cached: whether the measurement came from the cache.
    """

    index: int
    step: str
    policy: Policy
    evaluation: Evaluation
    met: bool
    miss: float
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "step": self.step, "policy": self.policy.to_dict(), "met": self.met,
                "miss": self.miss, "cached": self.cached, "latency_s": self.evaluation.latency_s,
                "memory_bytes": self.evaluation.memory_bytes, "quality": self.evaluation.quality}


def literal(name: str) -> str:
    """A rule pattern matching the module ``name`` only: the glob characters a module name
    may hold (``*``, ``?``, ``[``, as in a ``ModuleDict`` key ``"a[0]"``) written as classes.
    The group ``*`` (every module of a bare model) stays a glob."""
    if name == "*":
        return name
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


@dataclass(frozen=True)
class Config:
    """A point of the search space, turned into a :class:`Policy` by :meth:`policy`.

    Attributes:
        base: storage of every module (``Rule("*")``).
        compute: compute mode of the base rule (``None``: native).
        keep: modules pinned to fp32.
        storage: per-group storage overrides.
        upcast: per-group attention upcast settings.
        matmul: global float32 matmul level (``None``: leave the flags alone).
        compile: compile the components (``Policy.compile``, inductor defaults).
        reasons: per-group reasons for the storage overrides (the measurement behind each);
            ``"*"`` gives the base rule's.
    """

    base: str
    compute: str | None = None
    keep: tuple[str, ...] = ()
    storage: tuple[tuple[str, str], ...] = ()
    upcast: tuple[tuple[str, bool], ...] = ()
    matmul: str | None = None
    compile: bool = False
    reasons: tuple[tuple[str, str], ...] = ()

    def policy(self, name: str = "candidate") -> Policy:
        """The policy: base rule, per-group storage and upcast overrides, then the fp32 pins."""
        base_reason = (f"{self.base} weights everywhere by default" if self.base not in ("fp8", "fp8-e5m2") else
                       f"{self.base} weights (a scale per output channel) wherever the bound holds, computed in {self.compute or 'bf16'}")
        why = dict(self.reasons)
        rules = [Rule("*", storage=self.base, compute=self.compute, reason=why.get("*", base_reason))]
        for group, dtype in self.storage:
            rules.append(Rule(literal(group), storage=dtype,
                              reason=why.get(group, f"{group} stored in {dtype}: improved the objective within the bound")))
        for group, on in self.upcast:
            where = "fp32" if on else "the storage dtype"
            rules.append(Rule(literal(group), upcast_attention=on, reason=f"attention scores in {where}"))
        for unit in self.keep:
            rules.append(Rule(literal(unit), keep_fp32=True, reason="the bound fails when this module is 16-bit"))
        numerics = NumericSettings(matmul=self.matmul) if self.matmul else None
        return Policy(tuple(rules), numerics, name=name, compile=CompileSettings() if self.compile else None)


def dominates(a: Candidate, b: Candidate, bound: Any) -> bool:
    """``a`` is no worse in latency, memory and quality than ``b``, and better in one."""
    va = (a.evaluation.latency_s, a.evaluation.memory_bytes, -bound.score(a.evaluation.quality))
    vb = (b.evaluation.latency_s, b.evaluation.memory_bytes, -bound.score(b.evaluation.quality))
    return all(x <= y for x, y in zip(va, vb)) and any(x < y for x, y in zip(va, vb))


def frontier(path: list[Candidate], bound: Any) -> list[Candidate]:
    """Distinct evaluated policies not dominated by any other."""
    unique: dict[str, Candidate] = {}
    for c in path:
        unique.setdefault(json.dumps(c.policy.to_dict(), sort_keys=True), c)
    points = list(unique.values())
    return [c for c in points if not any(dominates(o, c, bound) for o in points if o is not c)]
