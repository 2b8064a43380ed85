"""The search: :class:`Search` measures configurations (memoised by canonical policy,
optionally stored, budgeted), and :func:`run_search` drives it.

Baseline, all-16-bit start(s), the presets, group testing over whole components then down
the module tree, fp8 weights for the memory objective (:func:`fp8_pass`), and greedy local
moves (:func:`improve_locally`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any, Callable, Protocol, Sequence

from mixprec.device.settings import MATMUL_LEVELS
from mixprec.policy import Policy
from mixprec.tuning.bounds import METRICS
from mixprec.tuning.candidates import Candidate, Config, Evaluation
from mixprec.tuning.group_testing import ModuleTree, hierarchical_keep, minimal_sufficient
from mixprec.tuning.policies import STEP_PREFIX
from mixprec.tuning.progress import TuneMeter, TuneProgress

__all__ = ["BudgetExhausted", "Search", "TuneProgress", "fp8_pass", "improve_locally", "run_search"]


class TuneStore(Protocol):
    """Where the search keeps its measurements and finds earlier ones: a :class:`mixprec.bench.store.Store`."""

    def get_tune_eval(self, key: str) -> dict[str, Any] | None: ...

    def put_tune_eval(self, key: str, **record: Any) -> None: ...

    def add_tune_run(self, **run: Any) -> int: ...


class BudgetExhausted(Exception):
    """The evaluation budget is spent; the search stops with what it measured."""


class Search:
    """Measure configurations: memoised by canonical policy JSON, optionally stored, budgeted.

    Args:
        evaluator: see :class:`mixprec.tuning.evaluators.Evaluator`.
        bound: a :class:`mixprec.tuning.bounds.Bound`.
        objective: ``latency`` or ``memory``.
        budget: most measured evaluations (``None``: unlimited).
        store: a :class:`mixprec.bench.store.Store` or ``None``.
        progress: called with a :class:`TuneProgress` after each candidate.
        hw_key: the machine fingerprint, part of every store key.
        should_stop: checked before each measurement; when true the search stops
            (:class:`BudgetExhausted` with ``cancelled`` set).
        meter: reports each measurement as it runs and each candidate (instead of ``progress``),
            see :class:`~mixprec.tuning.progress.TuneMeter`.
    """

    def __init__(self, evaluator: Any, bound: Any, objective: str, budget: int | None, store: Any,
                 progress: Callable[[TuneProgress], None] | None, hw_key: str,
                 should_stop: Callable[[], bool] | None = None, *, meter: TuneMeter | None = None):
        self.evaluator, self.bound, self.objective, self.budget = evaluator, bound, objective, budget
        self.store, self.progress, self.hw_key, self.should_stop = store, progress, hw_key, should_stop
        self.meter = meter
        if meter is not None:
            meter.search = self
        self.memo: dict[str, Evaluation] = {}
        self.path: list[Candidate] = []
        self.measured = self.cached = 0
        self.cancelled = False
        #: evaluations started ahead (canonical policy -> future), see :meth:`prefetch`
        self.ahead: dict[str, Any] = {}

    def _canonical(self, policy: Policy) -> str:
        return json.dumps(dataclasses.replace(policy, name="candidate").to_dict(), sort_keys=True)

    def prefetch(self, policies: Sequence[Policy]) -> None:
        """Start measuring ``policies`` (in order) on the evaluator's idle workers.

        Only an evaluator with ``submit`` and ``idle`` (a
        :class:`~mixprec.tuning.pool.PoolEvaluator`) measures ahead; others ignore this.
        Policies already measured, stored or started are skipped, and no more are
        started than the budget has left. A measurement made ahead counts as an
        evaluation only when the search asks for that policy (:meth:`evaluate_policy`),
        so the count, the path and the result are those of the sequential search; the
        rest are dropped, and :meth:`settle` says how many.
        """
        if not hasattr(self.evaluator, "submit") or self.cancelled:
            return
        for policy in policies:
            if self.evaluator.idle() <= 0:
                return
            if self.budget is not None and self.measured + len(self.ahead) >= self.budget:
                return
            canonical = self._canonical(policy)
            if canonical in self.ahead or self._lookup(canonical) is not None:
                continue
            self.ahead[canonical] = self.evaluator.submit(policy)

    def settle(self, notes: list[str]) -> None:
        """Drop the measurements made ahead that the search never asked for, and say how many."""
        unused = list(self.ahead.values())
        self.ahead.clear()
        for future in unused:
            future.cancel()
        if unused:
            notes.append(f"{len(unused)} evaluation(s) measured ahead on idle workers were not needed (not counted)")

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
        canonical = self._canonical(policy)
        ev = self._lookup(canonical)
        cached = ev is not None
        if ev is None:
            if self.should_stop is not None and self.should_stop():
                self.cancelled = True
                raise BudgetExhausted("cancelled")
            if self.budget is not None and self.measured >= self.budget:
                raise BudgetExhausted
            ahead = self.ahead.pop(canonical, None)
            if self.meter is not None:
                self.meter.evaluating(len(self.path), step)
            ev = ahead.result() if ahead is not None else self.evaluator.evaluate(policy)
            if self.meter is not None:
                self.meter.evaluated()
            self.measured += 1
            self._save(canonical, policy, ev)
        else:
            self.cached += 1
            self.memo[canonical] = ev
        cand = Candidate(len(self.path), step, policy, ev, self.bound.met(ev.quality), self.bound.miss(ev.quality), cached)
        self.path.append(cand)
        if self.meter is not None:
            self.meter.candidate(cand)
        elif self.progress is not None:
            self.progress(TuneProgress(self.measured, self.budget, cand, self.best(), self.path))
        return cand

    def phase(self, step: str) -> None:
        """Say what the search does now (work that is not an evaluation, e.g. a profile)."""
        if self.meter is not None:
            self.meter.begin(step)

    def cost(self, cand: Candidate) -> tuple[float, float]:
        ev = cand.evaluation
        return (ev.latency_s, ev.memory_bytes) if self.objective == "latency" else (ev.memory_bytes, ev.latency_s)

    def best(self) -> Candidate | None:
        ok = [c for c in self.path if c.met]
        return min(ok, key=self.cost) if ok else None


def run_search(search: Search, evaluator: Any, fast: list[str], notes: list[str], local_search: bool,
               improvement: float, presets: Sequence[tuple[str, Policy]] = (), *, try_compile: bool = False,
               fp8: bool = True) -> None:
    """Baseline, all-16-bit start(s), the presets, keep-fp32 bisection if needed, then local search.

    Every candidate lands on ``search.path``; remarks are appended to ``notes``.
    Raises :class:`BudgetExhausted` when the budget runs out. With a parallel evaluator
    the evaluations the search will ask for next are measured ahead (:meth:`Search.prefetch`).
    """
    try:
        _run_search(search, evaluator, fast, notes, local_search, improvement, presets, try_compile=try_compile, fp8=fp8)
    finally:
        search.settle(notes)


def _starts(objective: str, fast: list[str]) -> list[Config]:
    """The all-16-bit starting points."""
    if fast:
        starts = [Config(fast[0])]
        if objective == "memory":
            starts = [Config(d) for d in fast] + [Config("fp16", compute="fp32")]
        return starts
    if objective == "memory":
        return [Config(d, compute="fp32") for d in ("bf16", "fp16")]  # 16-bit storage only: compute stays fp32
    return []  # 16-bit compute is emulated here: it cannot win on latency


def _run_search(search: Search, evaluator: Any, fast: list[str], notes: list[str], local_search: bool,
                improvement: float, presets: Sequence[tuple[str, Policy]], *, try_compile: bool, fp8: bool = True) -> None:
    starts = _starts(search.objective, fast)
    # one round: none of these depends on another's result
    first_round = [Config("fp32").policy(), *(cfg.policy() for cfg in starts), *(policy for _, policy in presets)]
    search.prefetch(first_round)
    baseline = search.evaluate(Config("fp32"), "baseline fp32")
    if search.bound.key not in baseline.evaluation.quality:
        available = ", ".join(k for k, v in METRICS.items() if v in baseline.evaluation.quality)
        raise ValueError(f"bound {search.bound} reads {search.bound.key!r}, which this target does not produce; "
                         f"metrics available here: {available}")
    start_cands = []
    for cfg in starts:
        search.prefetch(first_round)
        start_cands.append((cfg, search.evaluate(cfg, f"all-{cfg.base}" + (f" compute {cfg.compute}" if cfg.compute else ""))))
    config, cand = min(start_cands, key=lambda p: (not p[1].met, p[1].miss, search.cost(p[1])),
                       default=(Config("fp32"), baseline))
    for name, policy in presets:  # candidates too: the result is never worse than a measured preset (or user policy)
        search.prefetch(first_round)
        search.evaluate_policy(policy, name if name.startswith(STEP_PREFIX) else f"preset {name}")
    if not baseline.met:
        notes.append("the fp32 baseline itself misses the bound: nothing to keep fp32 can meet it")
        return
    if not cand.met:
        # profile the start as it is: its own rounding (bf16 weights with fp32 compute have an error
        # too), and no emulated 16-bit arithmetic where the probe found none fast
        search.phase(f"profiling #{cand.index} {cand.step[:40]} (the own error of every module)")
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

        def ahead(keeps: Sequence[frozenset[str]]) -> None:
            search.prefetch([dataclasses.replace(base, keep=tuple(n for n in order if n in k)).policy() for k in keeps])

        # keeping more than half of what the needed components hold buys little over the whole components
        keep = hierarchical_keep(tree, top, suffices, max_prefix=len(top) // 2 if whole else None, notes=notes,
                                 ahead=ahead)
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
    if search.objective == "memory" and fp8:
        config, cand = fp8_pass(search, evaluator, config, cand, notes)
    if local_search:
        improve_locally(search, evaluator, config, cand, fast, improvement, try_compile=try_compile)


def fp8_pass(search: Search, evaluator: Any, config: Config, cand: Candidate, notes: list[str]) -> tuple[Config, Candidate]:
    """The memory objective's last step: weights in fp8 wherever the bound still holds.

    From the 16-bit configuration that meets the bound, every layer's weights go to fp8
    (computed in that configuration's compute dtype, its fp32 pins kept), the weights that
    model code reads included (a rule names each: an fp8 policy would otherwise keep them
    16-bit for safety; measured here instead). Where that misses the bound, the profile
    measures each layer's own error with fp8 weights, and group testing (riskiest first)
    finds a small set of layers to keep in 16 bits: the exceptions, each with its measured
    error in its rule's reason. The result replaces the 16-bit one only when it meets the
    bound and stores fewer bytes.
    """
    if not cand.met or config.base not in ("bf16", "fp16"):
        return config, cand
    sixteen = config.base
    compute = "fp32" if config.compute == "fp32" else sixteen
    read = dict(evaluator.fp8_read()) if hasattr(evaluator, "fp8_read") else {}
    base = dataclasses.replace(config, base="fp8", compute=compute, storage=(), reasons=())
    ranked: list[str] = []
    own: dict[str, float] = {}

    def config_for(keep: frozenset[str]) -> Config:
        kept = [u for u in ranked if u in keep]
        named = [u for u in read if u not in keep]
        errors = [db for u, db in own.items() if u not in keep and math.isfinite(db)]
        measured = f"; the layers' own error with fp8 weights measured {min(errors):.1f} to {max(errors):.1f} dB" if errors else ""
        summary = (f"fp8 weights (a scale per output channel) computed in {compute}"
                   + (f", except {len(kept)} layer(s) kept in {sixteen}" if kept else "") + measured)
        reasons = [("*", summary)]
        reasons += [(u, f"fp8, though an fp8 policy keeps it out by default ({read[u]}): the bound holds with it in fp8 "
                        "(measured on the search's inputs)") for u in named]
        reasons += [(u, f"kept in {sixteen}: its own error with fp8 weights measured "
                        f"{f'{own[u]:.1f} dB' if u in own else 'not measured'}; the bound fails with it in fp8") for u in kept]
        return dataclasses.replace(base, storage=tuple([(u, "fp8") for u in named] + [(u, sixteen) for u in kept]),
                                   reasons=tuple(reasons))

    whole = search.evaluate(config_for(frozenset()), f"all-fp8 compute {compute}")
    if whole.met:
        return (config_for(frozenset()), whole) if search.cost(whole) < search.cost(cand) else (config, cand)
    search.phase(f"profiling #{whole.index} all-fp8 (the own error of every layer with fp8 weights)")
    tree = ModuleTree(evaluator.risk(config_for(frozenset()).policy()), evaluator.units())
    own.update({u: float(tree.row[u]["own_sqnr_db"]) for u in evaluator.units()
                if u in tree.row and isinstance(tree.row[u].get("own_sqnr_db"), (int, float))})

    def noise_per_weight(unit: str) -> tuple[bool, float]:
        # Memory is the objective: a layer kept in 16 bits costs a byte per weight, so the
        # layers with the most noise per weight come first (an embedding table that is most of
        # the model comes last, a small noisy projection first); overflows before anything.
        row = tree.row[unit]
        db = own.get(unit, math.inf)
        noise = math.inf if math.isnan(db) else 10 ** (-db / 10) if math.isfinite(db) else (0.0 if db > 0 else math.inf)
        bad = row.get("own_nonfinite") or (compute == "fp16" and row.get("overflows_fp16"))
        return (not bad, -noise / max(int(row.get("elements") or 1), 1))

    ranked[:] = sorted((u for u in evaluator.units() if u in tree.row), key=noise_per_weight)
    # Where more than three quarters of the layers must stay 16-bit, fp8 saves little: one
    # evaluation says so, instead of pruning a long list.
    needed = minimal_sufficient(ranked, lambda keep: search.evaluate(config_for(keep), f"fp8, keep {len(keep)} in {sixteen}").met,
                                empty_fails=True, max_prefix=max(1, len(ranked) * 3 // 4),
                                ahead=lambda keeps: search.prefetch([config_for(k).policy() for k in keeps]))
    if needed is None:
        notes.append(f"fp8 weights: the bound needs more than three quarters of the layers in {sixteen}; they stay {sixteen}")
        return config, cand
    trial_cfg = config_for(frozenset(needed))
    trial = search.evaluate(trial_cfg, f"verify fp8 with {len(needed)} in {sixteen}")
    if not (trial.met and search.cost(trial) < search.cost(cand)):
        notes.append(f"fp8 weights with {len(needed)} layer(s) in {sixteen} "
                     + ("miss the bound on re-measurement" if not trial.met else f"store no fewer bytes than all-{sixteen}"))
        return config, cand
    notes.append(f"fp8 weights except {len(needed)} layer(s) kept in {sixteen} (riskiest by their own error with fp8 "
                 f"weights): {', '.join(needed[:6])}{', ...' if len(needed) > 6 else ''}")
    return trial_cfg, trial


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

    needed = minimal_sufficient(ranked, lambda keep: search.evaluate(with_fp32(keep), f"bisect components {len(keep)}").met,
                                ahead=lambda keeps: search.prefetch([with_fp32(k).policy() for k in keeps]))
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
        for index, (step, move) in enumerate(moves):
            trial_cfg = move(config)
            if trial_cfg is None:
                continue
            # this move and the next ones from the current configuration: a round, unless one is accepted
            search.prefetch([c.policy() for c in (m(config) for _, m in moves[index:]) if c is not None])
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
