"""Building blocks of :func:`mixprec.tune.tune`: measuring, group testing, the search.

A :class:`Session` holds a target, its fp32 reference outputs for a set of seeds,
and measures a policy end to end (quality worst case over the seeds, median latency,
weight bytes). It runs in the caller's process (:class:`mixprec.tune.InProcessEvaluator`)
or inside a benchmark worker (:func:`serve_tune`, reached through
:mod:`mixprec.measure.executor`).

:func:`minimal_sufficient` finds a minimal set that must stay fp32 with adaptive group
testing: a galloping search for the shortest sufficient prefix of the risk order, then a
divide-and-conquer pruning of that prefix. :func:`hierarchical_keep` applies it level by
level down the module tree (:class:`ModuleTree`, ranked by the profile's own error of
every layer, block and component). :func:`run_search` drives the whole search
(baseline, all-16-bit start, components, the tree, greedy local search) through a
:class:`Search`, which memoises and optionally stores every measurement.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from mixprec.casting.apply import apply, components_of
from mixprec.diagnose.profile import profile
from mixprec.measure import metrics as bench_metrics
from mixprec.policy import CompileSettings, Policy, Rule
from mixprec.device.settings import MATMUL_LEVELS, NumericSettings

__all__ = [
    "LOWER_IS_BETTER", "METRICS", "Session", "worst_case", "weight_units", "ModuleTree", "hierarchical_keep", "minimal_sufficient",
    "Evaluation", "Candidate", "BudgetExhausted", "Config", "Search", "TuneProgress", "run_search", "improve_locally",
    "finalists", "retime", "pick_final", "frontier",
    "serve_tune",
]

#: Quality metrics where a smaller value is better; every other metric is higher-better.
LOWER_IS_BETTER: frozenset[str] = frozenset({"max_abs_err", "rel_err", "lsd_db", "nonfinite"})


def _worse(metric: str, a: float, b: float) -> float:
    if isinstance(a, float) and math.isnan(a):
        return a
    if isinstance(b, float) and math.isnan(b):
        return b
    return max(a, b) if metric in LOWER_IS_BETTER else min(a, b)


def worst_case(per_seed: Sequence[dict[str, float]]) -> dict[str, float]:
    """Combine per-seed quality dicts: min of higher-better metrics, max of lower-better ones (nan wins)."""
    out: dict[str, float] = {}
    for quality in per_seed:
        for key, value in quality.items():
            if value is None:
                continue
            value = float(value)
            out[key] = value if key not in out else _worse(key, out[key], value)
    return out


def weight_units(components: dict[str, torch.nn.Module]) -> list[str]:
    """Qualified names of the modules that own floating-point parameters directly."""
    names = []
    for cname, root in components.items():
        for name, module in root.named_modules():
            if any(p is not None and p.is_floating_point() for p in module._parameters.values()):
                names.append(((f"{cname}.{name}" if name else cname) if cname else name) or "")
    return names


def _output(result: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    if isinstance(result, torch.Tensor):
        return result, {}
    tensor = getattr(result, "output", None)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"run must return a tensor or an object with an .output tensor, got {type(result).__name__}")
    extras = result.extras() if hasattr(result, "extras") else {}
    return tensor, extras


class Session:
    """Measure policies on one target against fp32 references computed once.

    Args:
        target: what :func:`mixprec.apply` takes (module, mapping or pipeline).
        make_inputs: seed -> inputs for ``run``.
        run: inputs -> output (tensor, or an object with ``.output``).
        seeds: the seeds quality is measured on; latency uses the first.
        kind: output kind for :func:`mixprec.measure.metrics.quality`.
        teacher_force: optional ``(inputs, reference_output) -> inputs`` replaying the
            reference's discrete choices.
    """

    def __init__(self, target: Any, make_inputs: Callable[[int], Any], run: Callable[[Any], Any], *,
                 seeds: Sequence[int], kind: str = "embedding",
                 teacher_force: Callable[[Any, Any], Any] | None = None, sample_rate: int | None = None):
        if not seeds:
            raise ValueError("seeds must name at least one seed, got an empty sequence")
        self.target, self.run, self.kind, self.sample_rate = target, run, kind, sample_rate
        self.make_inputs, self.teacher_force = make_inputs, teacher_force
        self.seeds = tuple(int(s) for s in seeds)
        self.inputs: dict[int, Any] = {}
        self.references: dict[int, torch.Tensor] = {}
        self._reference(self.seeds)

    def _reference(self, seeds: Sequence[int]) -> None:
        """Run fp32 on the seeds not seen yet: their inputs and reference outputs."""
        with torch.inference_mode():
            for seed in seeds:
                if seed in self.references:
                    continue
                inputs = self.make_inputs(seed)
                result = self.run(inputs)
                tensor, _ = _output(result)
                self.references[seed] = tensor.detach().float().cpu().clone()
                self.inputs[seed] = self.teacher_force(inputs, result) if self.teacher_force is not None else inputs

    @property
    def components(self) -> dict[str, torch.nn.Module]:
        return components_of(self.target)[0]

    def _quality(self, seed: int) -> dict[str, float]:
        result = self.run(self.inputs[seed])
        tensor, extras = _output(result)
        quality = bench_metrics.quality(tensor.detach().float().cpu(), self.references[seed], self.kind,
                                        sample_rate=self.sample_rate)
        if extras.get("token_agreement") is not None:
            quality["token_agreement"] = float(extras["token_agreement"])
        return {k: float(v) for k, v in quality.items() if v is not None}

    def evaluate(self, policy: Policy, repeat: int) -> dict[str, Any]:
        """Apply ``policy``, measure quality on every seed and ``repeat`` timed runs, revert."""
        with apply(self.target, policy) as applied, torch.inference_mode():
            per_seed = {seed: self._quality(seed) for seed in self.seeds}  # the first run warms up
            samples = []
            for _ in range(max(1, repeat)):
                start = time.perf_counter()
                self.run(self.inputs[self.seeds[0]])
                samples.append(time.perf_counter() - start)
            memory = applied.weight_bytes()
        return {"latency_s": statistics.median(samples), "samples": samples, "memory_bytes": float(memory),
                "quality": worst_case(list(per_seed.values())), "per_seed": per_seed}

    def qualities(self, policy: Policy, seeds: Sequence[int]) -> dict[int, dict[str, float]]:
        """Quality of ``policy`` on each of ``seeds`` (fp32 references computed for new seeds first)."""
        seeds = [int(s) for s in seeds]
        self._reference(seeds)
        with apply(self.target, policy), torch.inference_mode():
            return {seed: self._quality(seed) for seed in seeds}

    def time(self, policy: Policy, repeat: int = 1) -> list[float]:
        """Seconds of ``repeat`` runs under ``policy`` on the first seed (no quality runs).

        A compiled policy first makes one untimed call, which compiles.
        """
        with apply(self.target, policy), torch.inference_mode():
            if policy.compile is not None:
                self.run(self.inputs[self.seeds[0]])
            samples = []
            for _ in range(max(1, repeat)):
                start = time.perf_counter()
                self.run(self.inputs[self.seeds[0]])
                samples.append(time.perf_counter() - start)
        return samples

    def risk(self, policy: Policy) -> list[dict[str, Any]]:
        """Every module holding weights under ``policy``, riskiest first (from :func:`mixprec.profile`).

        Rows cover the weight-owning layers (``unit`` true) and every block and
        component enclosing one, each with its own error: the prior of the
        hierarchical search (:func:`hierarchical_keep`).
        """
        units = set(weight_units(self.components))
        enclosing = {unit.rsplit(".", k)[0] for unit in units for k in range(1, unit.count(".") + 1)}
        prof = profile(self.target, self.inputs[self.seeds[0]], policy, run=self.run)
        rows = []
        for stats in prof.modules:
            if stats.module not in units and stats.module not in enclosing:
                continue
            own = stats.own_sqnr_db if stats.own_sqnr_db is not None else math.inf
            rows.append({"module": stats.module, "own_sqnr_db": own, "overflows_fp16": bool(stats.overflows_fp16),
                         "own_nonfinite": bool(stats.own_nonfinite), "unit": stats.module in units})
        rows.sort(key=_risk_key)
        return rows


def _risk_key(row: dict[str, Any]) -> tuple[bool, float]:
    """Riskiest first: overflow or inf/NaN, then the lowest own SQNR."""
    own = row["own_sqnr_db"]
    return (not (row["overflows_fp16"] or row["own_nonfinite"]), own if not math.isnan(own) else -math.inf)


def minimal_sufficient(units: Sequence[str], suffices: Callable[[frozenset[str]], bool], *,
                       max_prefix: int | None = None, empty_fails: bool = False) -> list[str] | None:
    """A minimal subset ``K`` of ``units`` with ``suffices(K)``, assuming ``suffices(units)``.

    ``suffices`` should be monotone (a superset of a sufficient set suffices). First a
    galloping then binary search finds the shortest sufficient prefix of ``units``
    (riskiest first); its last element is then necessary, and the rest of the prefix
    is pruned by divide and conquer (about ``2 k log2(n / k)`` calls for ``k`` needed
    units among ``n``).

    Args:
        units: candidates, most likely needed first.
        suffices: whether keeping exactly this set fp32 meets the bound.
        max_prefix: give up (return ``None``) when the shortest sufficient prefix is
            longer than this: the needed set is then too large to be worth pruning.
        empty_fails: the caller already knows the empty set does not suffice (skip
            testing it).

    Returns:
        The needed units, in ``units`` order (``None`` when ``max_prefix`` is exceeded).
    """
    units = list(units)
    if not units or (not empty_fails and suffices(frozenset())):
        return []
    # galloping: prefixes of 1, 2, 4, ... until one suffices (the full list is assumed to)
    low, high = 0, len(units)  # prefix of length `low` fails, `high` suffices
    if max_prefix is not None and max_prefix < len(units):
        if not suffices(frozenset(units[:max_prefix])):
            return None
        high = max_prefix
    size = 1
    while size < high:
        if suffices(frozenset(units[:size])):
            high = size
            break
        low = size
        size *= 2
    while high - low > 1:
        mid = (low + high) // 2
        if suffices(frozenset(units[:mid])):
            high = mid
        else:
            low = mid
    last = units[high - 1]
    rest = _prune(frozenset({last}), units[: high - 1], suffices, changed=True) if high > 1 else []
    chosen = set(rest) | {last}
    return [u for u in units if u in chosen]


def _prune(fixed: frozenset[str], candidates: list[str], suffices: Callable[[frozenset[str]], bool], *,
           changed: bool) -> list[str]:
    """Minimal subset of ``candidates`` that, with ``fixed``, suffices (``fixed | candidates`` does)."""
    if changed and suffices(fixed):
        return []
    if len(candidates) <= 1:
        return list(candidates)
    half = len(candidates) // 2
    first, second = candidates[:half], candidates[half:]
    need_second = _prune(fixed | frozenset(first), second, suffices, changed=bool(first))
    need_first = _prune(fixed | frozenset(need_second), first, suffices, changed=bool(need_second))
    return need_first + need_second


#: A block's layers "look harmless" when each one's own SQNR is more than this many dB
#: above the block's own SQNR: the block's error then comes from how they combine, and
#: the search keeps the block rather than searching inside it.
COMBINED_GAP_DB = 10.0


class ModuleTree:
    """The module tree the hierarchical search walks, with the profile's risk per node.

    Nodes are the weight-owning layers (``units``) and every module enclosing one;
    ``""`` is the whole target. A node's risk is its own error from
    :meth:`Session.risk` (an overflow or inf/NaN counts as riskiest); a node the
    profile did not measure (a ``ModuleList`` is never called) takes its riskiest
    child's.

    Args:
        rows: :meth:`Session.risk` rows.
        units: the weight-owning modules.
    """

    def __init__(self, rows: Sequence[dict[str, Any]], units: Sequence[str]):
        self.units = set(units)
        self.row = {r["module"]: r for r in rows}
        nodes: set[str] = set()
        for name in [*units, *self.row]:
            while name and name not in nodes:
                nodes.add(name)
                name = name.rpartition(".")[0]
        self.children: dict[str, list[str]] = {"": []}
        for name in sorted(nodes):
            self.children.setdefault(name, [])
            self.children.setdefault(name.rpartition(".")[0], []).append(name)
        self._risk: dict[str, tuple[bool, float]] = {}

    def _measured(self, name: str) -> dict[str, Any] | None:
        """The node's profile row, or ``None`` when its own error was not measured (a block
        with no row, or one the profile left at +inf)."""
        row = self.row.get(name)
        if row is None or (row["own_sqnr_db"] == math.inf and self.children.get(name)):
            return None
        return row

    def risk(self, name: str) -> tuple[bool, float]:
        """Sort key, riskiest first."""
        if name not in self._risk:
            row = self._measured(name)
            self._risk[name] = _risk_key(row) if row is not None else min(
                (self.risk(c) for c in self.children.get(name, [])), default=(True, math.inf))
        return self._risk[name]

    def own_db(self, name: str) -> float | None:
        """The node's own SQNR in dB (``-inf`` for an overflow), ``None`` when not measured."""
        row = self._measured(name)
        if row is None:
            return None
        key = _risk_key(row)
        return -math.inf if not key[0] else key[1]

    def ranked(self, names: Sequence[str]) -> list[str]:
        return sorted(names, key=self.risk)

    def inside(self, name: str) -> list[str]:
        """What searching inside ``name`` tests: its children, passing through chains of
        single children (a ``ModuleList`` under a lone encoder) to where the tree branches."""
        children = self.children.get(name, [])
        while len(children) == 1 and children[0] not in self.units:
            children = self.children.get(children[0], [])
        return list(children)

    def combined(self, name: str, gap_db: float = COMBINED_GAP_DB) -> bool:
        """Whether ``name``'s error comes from how its children combine: its own SQNR is
        measured and every child's is more than ``gap_db`` above it."""
        own = self.own_db(name)
        if own is None or own == -math.inf:
            return False
        for child in self.inside(name):
            child_db = self.risk(child)
            if not child_db[0] or child_db[1] <= own + gap_db:
                return False
        return True


def hierarchical_keep(tree: ModuleTree, top: Sequence[str], suffices: Callable[[frozenset[str]], bool], *,
                      max_prefix: int | None = None, notes: list[str] | None = None) -> list[str] | None:
    """A small set of modules to keep fp32, found top down through the module tree.

    At each level the nodes are group-tested riskiest first (:func:`minimal_sufficient`).
    The search descends into a node it must keep only when the node has more than one
    child and some child's own error could explain the node's (:meth:`ModuleTree.combined`
    is false); inside it the children are group-tested with everything else kept as
    found, and the node stays whole when more than half of its children would be needed.
    A node whose layers each look harmless is kept whole without further evaluations:
    its error comes from how they combine.

    Args:
        tree: the module tree with the profile's risk.
        top: the first level (for example the children of the model, or of the
            components that must otherwise stay fp32).
        suffices: whether keeping exactly this set of nodes fp32 meets the bound.
        max_prefix: passed to the first level (``None``: no limit).
        notes: remarks are appended here.

    Returns:
        The nodes to keep (blocks or layers), or ``None`` when the first level needs more
        than ``max_prefix`` nodes.
    """
    notes = notes if notes is not None else []
    noted: set[str] = set()

    def level(nodes: Sequence[str], fixed: frozenset[str], limit: int | None, empty_fails: bool) -> list[str] | None:
        needed = minimal_sufficient(tree.ranked(nodes), lambda keep: suffices(fixed | keep), max_prefix=limit,
                                    empty_fails=empty_fails)
        return None if needed is None else refine(list(needed), fixed)

    def refine(kept: list[str], fixed: frozenset[str]) -> list[str]:
        descend = []
        for node in kept:
            children = tree.inside(node)
            if len(children) < 2 or node in tree.units:
                continue
            if tree.combined(node):
                if node in noted:
                    continue
                noted.add(node)
                notes.append(f"{node}: kept whole, its error comes from how its layers combine "
                             f"(own {tree.own_db(node):.1f} dB; each part {COMBINED_GAP_DB:g}+ dB better)")
            else:
                descend.append(node)
        if len(descend) > 1:
            # one evaluation for the prior's guess: each block replaced by its riskiest part
            guess = {node: tree.ranked(tree.inside(node))[0] for node in descend}
            trial = [k for k in kept if k not in guess] + list(guess.values())
            if suffices(fixed | frozenset(trial)):
                return refine(trial, fixed)
        for node in descend:
            others = frozenset(k for k in kept if k != node)
            children = tree.inside(node)
            inner = level(children, fixed | others, len(children) // 2, empty_fails=True)
            if inner is not None:
                kept = [k for k in kept if k != node] + inner
        return kept

    return level(list(top), frozenset(), max_prefix, empty_fails=False)


#: Bound metric name -> quality key it reads.
METRICS: dict[str, str] = {
    "sqnr": "sqnr_db", "snr": "snr_db", "psnr": "psnr_db", "cosine": "cosine", "rel_err": "rel_err",
    "max_abs_err": "max_abs_err", "ssim": "ssim", "token_agreement": "token_agreement",
}


# -- the search ----------------------------------------------------------------------------


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


class BudgetExhausted(Exception):
    """The evaluation budget is spent; the search stops with what it measured."""


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
    """

    base: str
    compute: str | None = None
    keep: tuple[str, ...] = ()
    storage: tuple[tuple[str, str], ...] = ()
    upcast: tuple[tuple[str, bool], ...] = ()
    matmul: str | None = None
    compile: bool = False

    def policy(self, name: str = "candidate") -> Policy:
        """The policy: base rule, per-group storage and upcast overrides, then the fp32 pins."""
        rules = [Rule("*", storage=self.base, compute=self.compute, reason=f"{self.base} weights everywhere by default")]
        for group, dtype in self.storage:
            rules.append(Rule(group, storage=dtype, reason=f"{group} stored in {dtype}: improved the objective within the bound"))
        for group, on in self.upcast:
            where = "fp32" if on else "the storage dtype"
            rules.append(Rule(group, upcast_attention=on, reason=f"attention scores in {where}"))
        for unit in self.keep:
            rules.append(Rule(unit, keep_fp32=True, reason="the bound fails when this module is 16-bit"))
        numerics = NumericSettings(matmul=self.matmul) if self.matmul else None
        return Policy(tuple(rules), numerics, name=name, compile=CompileSettings() if self.compile else None)


@dataclass
class TuneProgress:
    """What a tune run's ``progress`` callback receives after each candidate.

    Attributes:
        evaluations: measured evaluations so far (cache hits are free).
        budget: the evaluation budget (``None``: unlimited).
        latest: the candidate just evaluated.
        best: the best candidate meeting the bound so far, if any.
        path: every candidate so far, in order (read-only).
    """

    evaluations: int
    budget: int | None
    latest: Candidate
    best: Candidate | None
    path: list[Candidate]


class Search:
    """Measure configurations: memoised by canonical policy JSON, optionally stored, budgeted.

    Args:
        evaluator: see :class:`mixprec.tune.Evaluator`.
        bound: a :class:`mixprec.tune.Bound`.
        objective: ``latency`` or ``memory``.
        budget: most measured evaluations (``None``: unlimited).
        store: a :class:`mixprec.bench.store.Store` or ``None``.
        progress: called with a :class:`TuneProgress` after each candidate.
        hw_key: the machine fingerprint, part of every store key.
        should_stop: checked before each measurement; when true the search stops
            (:class:`BudgetExhausted` with ``cancelled`` set).
    """

    def __init__(self, evaluator: Any, bound: Any, objective: str, budget: int | None, store: Any,
                 progress: Callable[[TuneProgress], None] | None, hw_key: str,
                 should_stop: Callable[[], bool] | None = None):
        self.evaluator, self.bound, self.objective, self.budget = evaluator, bound, objective, budget
        self.store, self.progress, self.hw_key, self.should_stop = store, progress, hw_key, should_stop
        self.memo: dict[str, Evaluation] = {}
        self.path: list[Candidate] = []
        self.measured = self.cached = 0
        self.cancelled = False

    def _key(self, canonical: str) -> str:
        raw = f"{self.evaluator.cache_key}|{self.hw_key}|{canonical}"
        return hashlib.sha256(raw.encode()).hexdigest()

    def _lookup(self, canonical: str) -> Evaluation | None:
        if canonical in self.memo:
            return self.memo[canonical]
        if self.store is None:
            return None
        row = self.store.get_tune_eval(self._key(canonical))
        if row is None:
            return None
        return Evaluation(float(row["latency"]), float(row["memory"]), {k: float(v) for k, v in row["quality"].items()},
                          {int(seed): {k: float(v) for k, v in q.items()} for seed, q in row.get("per_seed", {}).items()})

    def _save(self, canonical: str, policy: Policy, ev: Evaluation) -> None:
        self.memo[canonical] = ev
        if self.store is not None:
            self.store.put_tune_eval(self._key(canonical), target=self.evaluator.cache_key, policy=policy.to_dict(),
                                     latency=ev.latency_s, memory=ev.memory_bytes, quality=ev.quality,
                                     per_seed=ev.per_seed)

    def evaluate(self, config: Config, step: str) -> Candidate:
        return self.evaluate_policy(config.policy(), step)

    def evaluate_policy(self, policy: Policy, step: str) -> Candidate:
        """Measure ``policy`` (or reuse an earlier measurement) and append it to the path."""
        canonical = json.dumps(dataclasses.replace(policy, name="candidate").to_dict(), sort_keys=True)
        ev = self._lookup(canonical)
        cached = ev is not None
        if ev is None:
            if self.should_stop is not None and self.should_stop():
                self.cancelled = True
                raise BudgetExhausted("cancelled")
            if self.budget is not None and self.measured >= self.budget:
                raise BudgetExhausted
            ev = self.evaluator.evaluate(policy)
            self.measured += 1
            self._save(canonical, policy, ev)
        else:
            self.cached += 1
            self.memo[canonical] = ev
        cand = Candidate(len(self.path), step, policy, ev, self.bound.met(ev.quality), self.bound.miss(ev.quality), cached)
        self.path.append(cand)
        if self.progress is not None:
            self.progress(TuneProgress(self.measured, self.budget, cand, self.best(), self.path))
        return cand

    def cost(self, cand: Candidate) -> tuple[float, float]:
        ev = cand.evaluation
        return (ev.latency_s, ev.memory_bytes) if self.objective == "latency" else (ev.memory_bytes, ev.latency_s)

    def best(self) -> Candidate | None:
        ok = [c for c in self.path if c.met]
        return min(ok, key=self.cost) if ok else None


def run_search(search: Search, evaluator: Any, fast: list[str], notes: list[str], local_search: bool,
               improvement: float, presets: Sequence[tuple[str, Policy]] = (), *, try_compile: bool = False) -> None:
    """Baseline, all-16-bit start(s), the presets, keep-fp32 bisection if needed, then local search.

    Every candidate lands on ``search.path``; remarks are appended to ``notes``.
    Raises :class:`BudgetExhausted` when the budget runs out.
    """
    baseline = search.evaluate(Config("fp32"), "baseline fp32")
    if search.bound.key not in baseline.evaluation.quality:
        available = ", ".join(k for k, v in METRICS.items() if v in baseline.evaluation.quality)
        raise ValueError(f"bound {search.bound} reads {search.bound.key!r}, which this target does not produce; "
                         f"metrics available here: {available}")
    if fast:
        starts = [Config(fast[0])]
        if search.objective == "memory":
            starts = [Config(d) for d in fast] + [Config("fp16", compute="fp32")]
    elif search.objective == "memory":
        starts = [Config(d, compute="fp32") for d in ("bf16", "fp16")]  # 16-bit storage only: compute stays fp32
    else:
        starts = []  # 16-bit compute is emulated here: it cannot win on latency
    start_cands = [(cfg, search.evaluate(cfg, f"all-{cfg.base}" + (f" compute {cfg.compute}" if cfg.compute else "")))
                   for cfg in starts]
    config, cand = min(start_cands, key=lambda p: (not p[1].met, p[1].miss, search.cost(p[1])),
                       default=(Config("fp32"), baseline))
    for name, policy in presets:  # candidates too: the result is never worse than a measured preset
        search.evaluate_policy(policy, f"preset {name}")
    if not baseline.met:
        notes.append("the fp32 baseline itself misses the bound: nothing to keep fp32 can meet it")
        return
    if not cand.met:
        # profile the start as it is: its own rounding (bf16 weights with fp32 compute have an error
        # too), and no emulated 16-bit arithmetic where the probe found none fast
        rows = evaluator.risk(config.policy())
        tree = ModuleTree(rows, evaluator.units())
        groups = [g for g in evaluator.groups() if g != "*"]
        top = tree.inside("")
        whole: list[str] = []
        if len(groups) > 1:
            config, cand, whole = _component_pass(search, config, cand, tree, groups, notes)
            if not cand.met:
                return
            top = [n for g in whole for n in (tree.inside(g) if len(tree.inside(g)) > 1 else [g])]

        base = dataclasses.replace(config, storage=())
        order = _ordered(tree, top)

        def suffices(keep: frozenset[str]) -> bool:
            trial = dataclasses.replace(base, keep=tuple(n for n in order if n in keep))
            return search.evaluate(trial, f"bisect keep {len(keep)}").met

        # keeping more than half of what the needed components hold buys little over the whole components
        keep = hierarchical_keep(tree, top, suffices, max_prefix=len(top) // 2 if whole else None, notes=notes)
        if keep is None:
            notes.append(f"the bound needs more than half of the {len(top)} parts of "
                         f"{', '.join(whole)} in fp32: the whole component(s) stay fp32")
        else:
            trial_config = dataclasses.replace(base, keep=tuple(n for n in order if n in keep))
            trial = search.evaluate(trial_config, f"verify keep {len(keep)}")
            if trial.met:
                config, cand = trial_config, trial
            elif not whole:
                notes.append("the minimal keep-fp32 set found by group testing does not meet the bound on "
                             "re-measurement (quality is not monotone here); the best measured candidate is used")
                return
    if local_search:
        improve_locally(search, evaluator, config, cand, fast, improvement, try_compile=try_compile)


def _ordered(tree: ModuleTree, top: Sequence[str]) -> list[str]:
    """Every node under ``top`` (themselves included) in tree order: keep rules are written in it."""
    out: list[str] = []

    def walk(name: str) -> None:
        out.append(name)
        for child in tree.children.get(name, []):
            walk(child)

    for name in top:
        walk(name)
    return out


def _component_pass(search: Search, config: Config, cand: Candidate, tree: ModuleTree, groups: list[str],
                    notes: list[str]) -> tuple[Config, Candidate, list[str]]:
    """Group testing over whole components first (riskiest first): few evaluations, and a fallback answer.

    Returns the configuration with the needed components stored fp32 (when it meets the
    bound), its candidate, and the needed components: where the search inside goes on.
    """
    ranked = tree.ranked([g for g in groups if g in tree.children]) + [g for g in groups if g not in tree.children]

    def with_fp32(keep: frozenset[str]) -> Config:
        return dataclasses.replace(config, storage=tuple((g, "fp32") for g in ranked if g in keep))

    needed = minimal_sufficient(ranked, lambda keep: search.evaluate(with_fp32(keep), f"bisect components {len(keep)}").met)
    trial_config = with_fp32(frozenset(needed))
    trial = search.evaluate(trial_config, f"verify components {', '.join(needed)}")
    if not trial.met:
        notes.append("keeping whole components fp32 does not meet the bound on re-measurement (quality is not "
                     "monotone here); the best measured candidate is used")
        return config, cand, []
    notes.append(f"components needed in fp32: {', '.join(needed)}; then searching inside them")
    return trial_config, trial, list(needed)


def _moves(groups: list[str], fast: list[str], try_compile: bool = False) -> list[tuple[str, Callable[[Config], Config | None]]]:
    """Local moves, each a label and a function of the current configuration (``None``: no change)."""
    moves: list[tuple[str, Callable[[Config], Config | None]]] = []

    def storage_move(group: str, dtype: str) -> Callable[[Config], Config | None]:
        def move(cfg: Config) -> Config | None:
            if dict(cfg.storage).get(group, cfg.base) == dtype:
                return None
            return dataclasses.replace(cfg, storage=tuple((g, d) for g, d in cfg.storage if g != group) + ((group, dtype),))
        return move

    def upcast_move(group: str) -> Callable[[Config], Config | None]:
        def move(cfg: Config) -> Config | None:
            on = not dict(cfg.upcast).get(group, False)
            return dataclasses.replace(cfg, upcast=tuple((g, v) for g, v in cfg.upcast if g != group) + ((group, on),))
        return move

    def matmul_move(level: str) -> Callable[[Config], Config | None]:
        def move(cfg: Config) -> Config | None:
            return None if (cfg.matmul or "highest") == level else dataclasses.replace(cfg, matmul=level)
        return move

    moves += [(f"local: matmul {level}", matmul_move(level)) for level in MATMUL_LEVELS]  # global: first
    for group in groups:
        moves += [(f"local: {group} storage {dtype}", storage_move(group, dtype)) for dtype in [*fast, "fp32"]]
        if fast:  # with no 16-bit compute, attention scores are fp32 already
            moves.append((f"local: {group} toggle upcast_attention", upcast_move(group)))
    if try_compile:
        # Last: compiling pays off only on the configuration the other moves settled on.
        moves.append(("local: toggle compile", lambda cfg: dataclasses.replace(cfg, compile=not cfg.compile)))
    return moves


def improve_locally(search: Search, evaluator: Any, config: Config, cand: Candidate, fast: list[str],
                    improvement: float, *, passes: int = 2, try_compile: bool = False) -> None:
    """Greedy local search from ``config``: accept a move when it keeps the bound and improves the objective.

    Moves: the global float32 matmul level first, then per group (component) storage
    among ``fast`` and fp32 and attention upcast on or off. Stops after a pass without improvement,
    after ``passes`` passes, or when the budget runs out (:class:`BudgetExhausted`).
    A latency gain counts only above the ``improvement`` fraction (timing noise).
    """
    moves = _moves(evaluator.groups(), fast, try_compile)
    for _ in range(passes):
        improved = False
        for step, move in moves:
            trial_cfg = move(config)
            if trial_cfg is None:
                continue
            trial = search.evaluate(trial_cfg, step)
            a, b = search.cost(trial), search.cost(cand)
            if search.objective == "latency":
                better = a[0] < b[0] * (1 - improvement)
            else:
                better = a[0] < b[0] or (a[0] == b[0] and a[1] < b[1] * (1 - improvement))
            if trial.met and better:
                config, cand, improved = trial_cfg, trial, True
        if not improved:
            return


def finalists(search: Search, limit: int = 3) -> list[Candidate]:
    """The ``limit`` cheapest distinct candidates meeting the bound, plus the cheapest preset meeting it.

    The fp32 baseline (the path's first candidate) is added when it meets the bound, so
    the result's speed relative to fp32 comes from the same side-by-side rounds.
    """
    seen: set[str] = set()
    ranked = []
    for cand in sorted((c for c in search.path if c.met), key=search.cost):
        key = json.dumps(dataclasses.replace(cand.policy, name="candidate").to_dict(), sort_keys=True)
        if key not in seen:
            seen.add(key)
            ranked.append(cand)
    chosen = ranked[:limit]
    preset = next((c for c in ranked if c.step.startswith("preset ")), None)
    if preset is not None and preset not in chosen:
        chosen.append(preset)
    baseline = search.path[0] if search.path else None
    if baseline is not None and baseline.met and baseline not in chosen:
        chosen.append(baseline)
    return chosen


def retime(evaluator: Any, candidates: Sequence[Candidate], rounds: int) -> dict[int, list[float]]:
    """Time ``candidates`` side by side: one untimed round, then ``rounds`` interleaved timed rounds.

    Returns candidate index -> seconds per round. The search's own medians each come
    from a different moment of a shared machine; interleaving puts the finalists
    under the same load, so the smallest median here is the fairest winner.
    """
    samples: dict[int, list[float]] = {c.index: [] for c in candidates}
    for round_index in range(rounds + 1):
        for cand in candidates:
            seconds = evaluator.time(cand.policy, 1)
            if round_index > 0:
                samples[cand.index] += seconds
    return samples


def pick_final(final: dict[int, list[float]], known: Sequence[int] = (), *, margin: float = 0.0) -> tuple[int, str]:
    """The winner of the side-by-side re-timing, and why.

    The incumbent is the fastest (by median) of the ``known`` answers among the
    finalists (the presets and the fp32 baseline), else the fastest finalist. Another
    finalist replaces it only when it was faster in every interleaved round (a paired
    comparison under the same load) and its median is lower by more than ``margin``
    (a fraction), so a difference within the machine's noise never replaces a known
    setting with another policy.

    Args:
        final: candidate index -> seconds per round (same rounds, same order).
        known: the indices in ``final`` that are presets or the fp32 baseline.
        margin: the relative median gain a challenger must show.

    Example:
        >>> pick_final({1: [1.0, 1.0, 1.0], 2: [0.9, 1.1, 0.9]}, known=[1])
        (1, '#1 kept: no finalist was faster in every round')
    """
    if not final:
        raise ValueError("no finalists to choose from")
    median = {i: statistics.median(v) for i, v in final.items()}
    pool = [i for i in final if i in known] or list(final)
    incumbent = min(pool, key=median.get)
    rounds = final[incumbent]
    clearly = [i for i in final if i != incumbent and len(final[i]) == len(rounds) and rounds
               and all(a < b for a, b in zip(final[i], rounds)) and median[i] < median[incumbent] * (1 - margin)]
    if not clearly:
        return incumbent, (f"#{incumbent} kept: no finalist was faster in every round"
                           + (f" and by more than {margin:.0%}" if margin else ""))
    winner = min(clearly, key=median.get)
    return winner, (f"#{winner} chosen: faster than #{incumbent} in all {len(rounds)} rounds "
                    f"({median[winner] * 1e3:.1f} vs {median[incumbent] * 1e3:.1f} ms median)")


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


# -- worker side ---------------------------------------------------------------------------


def serve_tune(conn: Any, job: dict[str, Any]) -> None:  # pragma: no cover - runs in the worker process
    """Serve ``tune_reference`` / ``tune_profile`` / ``tune_eval`` / ``tune_time`` / ``tune_validate`` / ``finish``."""
    from mixprec import pipelines

    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    pipe = pipelines.get(job["pipeline"], size=job["size"], seed=0)
    batch = int(job.get("batch", 1))
    conn.send(("ready", {"output_kind": pipe.output_kind, "components": list(pipe.components),
                         "sensitive": [str(h) for h in pipe.sensitive],
                         "units": weight_units(pipe.components), "pid": __import__("os").getpid()}))
    session: Session | None = None
    while True:
        command, payload = conn.recv()
        if command == "tune_reference":
            start = time.perf_counter()
            session = Session(pipe, lambda seed: pipe.example_inputs(batch, seed), pipe.run, seeds=payload["seeds"],
                              kind=pipe.output_kind, teacher_force=pipe.teacher_forced, sample_rate=pipe.sample_rate)
            conn.send(("ok", {"seconds": time.perf_counter() - start}))
        elif command in ("tune_eval", "tune_profile", "tune_time", "tune_validate") and session is None:
            conn.send(("error", f"{command} before tune_reference"))
        elif command == "tune_eval":
            conn.send(("ok", session.evaluate(Policy.from_dict(payload["policy"]), int(payload.get("repeat", 3)))))
        elif command == "tune_time":
            conn.send(("ok", session.time(Policy.from_dict(payload["policy"]), int(payload.get("repeat", 1)))))
        elif command == "tune_profile":
            conn.send(("ok", session.risk(Policy.from_dict(payload["policy"]))))
        elif command == "tune_validate":
            conn.send(("ok", session.qualities(Policy.from_dict(payload["policy"]), payload["seeds"])))
        elif command == "finish":
            conn.send(("done", {}))
            return
        else:
            conn.send(("error", f"unknown command {command!r}; valid: tune_reference, tune_eval, tune_time, tune_profile, tune_validate, finish"))
