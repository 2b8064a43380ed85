"""Autotune: the fastest (or smallest) policy that keeps a quality bound, measured.

:func:`tune` starts from all-16-bit weights (the fastest 16-bit type the hardware
probe measured fast), uses :func:`mixprec.profile` as a prior (the own error of every
layer, block and component), finds a small set to keep fp32 by group testing down the
module tree when the bound fails, then improves the policy by a greedy local search
(per-component storage, attention upcast, float32 matmul level). The search works to
the bound tightened by a margin on its search seeds; the chosen policy is then checked
on held-out validation seeds, stepping along the frontier if it misses. Every candidate is
measured end to end by an *evaluator*: :class:`InProcessEvaluator` (any module) or
:class:`WorkerEvaluator` (a registered pipeline in one long-lived worker process).

Example:
    >>> import mixprec
    >>> result = mixprec.tune("tts", "snr>=30", budget=40)
    >>> result.policy.save("tuned.toml")
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from mixprec.tuning.search import (METRICS, BudgetExhausted, Candidate, Evaluation, Search, Session, TuneProgress, finalists,
                             frontier, pick_final, retime, run_search, weight_units, worst_case)
from mixprec.device.hardware import Hardware
from mixprec.policy import Policy
from mixprec.policy.presets import PRESETS, preset

__all__ = [
    "METRICS", "Bound", "parse_bound", "Evaluation", "Evaluator", "InProcessEvaluator", "WorkerEvaluator",
    "Candidate", "TuneProgress", "TuneResult", "tune", "render_tune_html",
]

_GRAMMAR = "'<metric> <op> <number>' with op one of >=, >, <=, <"
_BOUND_RE = re.compile(r"^\s*([a-z_]+)\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


# -- bounds ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bound:
    """A quality bound such as ``sqnr >= 30``.

    Attributes:
        metric: one of :data:`METRICS`.
        op: ``>=``, ``>``, ``<=`` or ``<``.
        value: the threshold.
    """

    metric: str
    op: str
    value: float

    @property
    def key(self) -> str:
        """The quality-dict key the bound reads (``sqnr`` -> ``sqnr_db``)."""
        return METRICS[self.metric]

    @property
    def higher_is_better(self) -> bool:
        return self.op in (">=", ">")

    def met(self, quality: dict[str, float]) -> bool:
        """Whether ``quality`` satisfies the bound (a missing or nan value does not)."""
        v = quality.get(self.key)
        if v is None or math.isnan(v):
            return False
        return {">=": v >= self.value, ">": v > self.value, "<=": v <= self.value, "<": v < self.value}[self.op]

    def miss(self, quality: dict[str, float]) -> float:
        """How far ``quality`` is from the threshold on the wrong side (0 at or past it; inf if unknown)."""
        v = quality.get(self.key)
        if v is None or math.isnan(v):
            return math.inf
        return max(0.0, self.value - v) if self.higher_is_better else max(0.0, v - self.value)

    def score(self, quality: dict[str, float]) -> float:
        """The bound's metric oriented so that larger is better (nan/missing -> -inf)."""
        v = quality.get(self.key)
        if v is None or math.isnan(v):
            return -math.inf
        return v if self.higher_is_better else -v

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def parse_bound(text: str | Bound) -> Bound:
    """Parse ``"sqnr>=30"`` into a :class:`Bound`.

    Raises:
        ValueError: text that does not follow the grammar, or an unknown metric; the
            message repeats the text, the grammar and the valid metrics.
    """
    if isinstance(text, Bound):
        return text
    valid = ", ".join(METRICS)
    match = _BOUND_RE.match(text.strip().lower()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"cannot parse bound {text!r}: expected {_GRAMMAR}, e.g. 'sqnr>=30'; metrics: {valid}")
    metric, op, number = match.groups()
    if metric not in METRICS:
        raise ValueError(f"bound {text!r}: unknown metric {metric!r}; expected {_GRAMMAR}; metrics: {valid}")
    value = float(number)
    if not math.isfinite(value):
        raise ValueError(f"bound {text!r}: {number} is not a finite number (1e999 overflows to infinity); give a finite threshold")
    return Bound(metric, op, value)


#: Metrics in dB, metrics that are error amplitudes, and scores in [0, 1] whose shortfall
#: from 1 behaves like an error power: how a margin in dB moves each one's threshold.
_DB_METRICS = frozenset({"sqnr", "snr", "psnr"})
_AMPLITUDE_METRICS = frozenset({"rel_err", "max_abs_err"})

#: The search's default margin: it looks for 1 dB less error than the bound allows.
DEFAULT_MARGIN_DB = 1.0


def tightened(bound: Bound, margin_db: float) -> Bound:
    """The bound the search works to: ``margin_db`` dB less error than ``bound`` allows.

    A dB metric moves by the margin (``sqnr>=40``, 1 dB: ``sqnr>=41``); an error
    amplitude by the factor ``10**(-margin/20)`` (``rel_err<=0.01``: ``<=0.00891``);
    a score in [0, 1] has its shortfall from 1 scaled by ``10**(-margin/10)``
    (``cosine>=0.99``: ``>=0.99206``), so the threshold never passes 1.

    Example:
        >>> str(tightened(parse_bound("sqnr>=40"), 1.0))
        'sqnr>=41'
    """
    if not math.isfinite(margin_db) or margin_db < 0:
        raise ValueError(f"margin {margin_db!r}: expected a finite number of dB >= 0 (0: no margin)")
    if margin_db == 0:
        return bound
    sign = 1.0 if bound.higher_is_better else -1.0  # the direction of "less error"
    if bound.metric in _DB_METRICS:
        value = bound.value + sign * margin_db
    elif bound.metric in _AMPLITUDE_METRICS:
        value = bound.value * 10 ** (sign * margin_db / 20)
    else:
        value = 1.0 - (1.0 - bound.value) * 10 ** (-sign * margin_db / 10)
    return Bound(bound.metric, bound.op, float(f"{value:.6g}"))


def validation_seed_list(spec: int | Sequence[int], search_seeds: Sequence[int]) -> tuple[int, ...]:
    """The validation seeds: ``spec`` seeds after the search seeds, or the seeds ``spec`` lists.

    Raises:
        ValueError: a negative count or seed, or seeds shared with the search (both lists named).
    """
    search = [int(s) for s in search_seeds]
    if isinstance(spec, bool):
        raise ValueError(f"validation seeds {spec!r}: expected a count >= 0 or a list of seeds")
    if isinstance(spec, int):
        if spec < 0:
            raise ValueError(f"validation seeds {spec}: expected a count >= 0 (0 disables validation) or a list of seeds")
        start = max(search, default=-1) + 1
        return tuple(range(start, start + spec))
    seeds = tuple(dict.fromkeys(int(s) for s in spec))
    if any(s < 0 for s in seeds):
        raise ValueError(f"validation seeds {list(seeds)}: seeds must be >= 0")
    shared = sorted(set(seeds) & set(search))
    if shared:
        raise ValueError(f"validation seeds {list(seeds)} overlap the search seeds {search} (both hold "
                         f"{', '.join(map(str, shared))}): validation must use inputs the search never saw")
    return seeds


# -- evaluators -----------------------------------------------------------------------------


class Evaluator(Protocol):
    """Measures a policy end to end.

    ``evaluate`` measures one policy; ``risk`` profiles one (weight-owning modules and
    the blocks enclosing them, riskiest first, as dicts with a ``module`` key);
    ``units`` lists the weight-owning modules; ``groups`` the rule matches the local
    search varies (component names, or ``*``); ``cache_key`` identifies target, seeds
    and repeat for a store. Optional: ``seeds`` (the search seeds) and
    ``validate(policy, seeds)`` (seed -> quality on seeds the search never used); an
    evaluator without ``validate`` cannot check the result on held-out seeds.
    """

    cache_key: str

    def evaluate(self, policy: Policy) -> Evaluation: ...

    def risk(self, policy: Policy) -> list[dict[str, Any]]: ...

    def groups(self) -> list[str]: ...

    def units(self) -> list[str]: ...


def _evaluation(raw: dict[str, Any]) -> Evaluation:
    per_seed = {int(seed): dict(q) for seed, q in raw.get("per_seed", {}).items()}
    return Evaluation(float(raw["latency_s"]), float(raw["memory_bytes"]), dict(raw["quality"]), per_seed)


def _fingerprint(components: dict[str, Any]) -> str:
    """A short hash of the module structure, shapes and parameter sums (tells models apart in a store)."""
    digest = hashlib.sha256()
    for cname, root in components.items():
        for name, tensor in [*root.named_parameters(), *root.named_buffers()]:
            total = float(tensor.detach().double().sum()) if tensor.is_floating_point() else 0.0
            digest.update(f"{cname}.{name}:{tuple(tensor.shape)}:{tensor.dtype}:{total!r};".encode())
    return digest.hexdigest()[:16]


def _groups(component_names: Sequence[str]) -> list[str]:
    return [c for c in component_names if c] or ["*"]


class InProcessEvaluator:
    """Evaluate policies in this process (synthetic models, tests, notebooks).

    Args:
        target: what :func:`mixprec.apply` takes.
        make_inputs: seed -> inputs for ``run``.
        run: inputs -> output tensor (or an object with ``.output``).
        seeds: quality is the worst case over these; latency is timed on the first.
        repeat: timed runs per evaluation (median).
        kind: output kind for :func:`mixprec.measure.metrics.quality` (``embedding``
            for ``(batch, dim)`` outputs).
        name: identifies the target in a store's cache (with a hash of its module
            structure, shapes and parameter sums).
    """

    def __init__(self, target: Any, make_inputs: Callable[[int], Any], run: Callable[[Any], Any], *,
                 seeds: Sequence[int] = (0, 1), repeat: int = 3, kind: str = "embedding", name: str = "in-process"):
        self.target, self.repeat = target, int(repeat)
        self.seeds = tuple(seeds)
        self.session = Session(target, make_inputs, run, seeds=self.seeds, kind=kind)
        self.cache_key = f"{name}|{_fingerprint(self.session.components)}|seeds={list(self.seeds)}|repeat={self.repeat}"

    def evaluate(self, policy: Policy) -> Evaluation:
        return _evaluation(self.session.evaluate(policy, self.repeat))

    def time(self, policy: Policy, repeat: int = 1) -> list[float]:
        """Seconds of ``repeat`` runs under ``policy`` on the first seed (no quality runs)."""
        return self.session.time(policy, repeat)

    def risk(self, policy: Policy) -> list[dict[str, Any]]:
        return self.session.risk(policy)

    def validate(self, policy: Policy, seeds: Sequence[int]) -> dict[int, dict[str, float]]:
        """Seed -> quality of ``policy`` on ``seeds`` (their fp32 references computed on first use)."""
        return self.session.qualities(policy, seeds)

    def groups(self) -> list[str]:
        return _groups(list(self.session.components))

    def units(self) -> list[str]:
        return weight_units(self.session.components)


class WorkerEvaluator:
    """Evaluate policies of a registered pipeline in one long-lived spawned worker.

    Args:
        pipeline_name: registered pipeline (see :func:`mixprec.pipelines.available`) or a
            factory spec ``module.path:factory`` / ``path/to/file.py:factory``.
        size: ``test`` or ``default``.
        seeds: quality seeds (teacher-forced on the fp32 reference where the
            pipeline makes discrete choices); latency is timed on the first.
        repeat: timed runs per evaluation (median).
        timeout: seconds one request may take.
    """

    def __init__(self, pipeline_name: str, size: str = "default", *, seeds: Sequence[int] = (0, 1), repeat: int = 3,
                 batch: int = 1, timeout: float = 600.0, threads: int | None = None):
        from mixprec.measure.executor import LocalProcessExecutor
        from mixprec.pipelines import portable_spec
        from mixprec.tuning.search import serve_tune

        pipeline_name = portable_spec(pipeline_name)  # a factory file path made absolute
        self.pipeline, self.size, self.seeds, self.repeat, self.timeout = pipeline_name, size, tuple(seeds), int(repeat), timeout
        self.cache_key = f"{pipeline_name}|size={size}|batch={batch}|seeds={list(self.seeds)}|repeat={self.repeat}"
        job = {"name": f"tune-{pipeline_name}", "pipeline": pipeline_name, "size": size,
               "batch": batch, "threads": threads}
        self._worker = LocalProcessExecutor().start(serve_tune, job)
        try:
            self.ready = self._worker.wait_ready(timeout)
            self._worker.request("tune_reference", {"seeds": list(self.seeds)}, timeout=timeout)
        except BaseException:
            self.close()
            raise

    def evaluate(self, policy: Policy) -> Evaluation:
        return _evaluation(self._worker.request("tune_eval", {"policy": policy.to_dict(), "repeat": self.repeat},
                                                timeout=self.timeout))

    def time(self, policy: Policy, repeat: int = 1) -> list[float]:
        """Seconds of ``repeat`` runs under ``policy`` on the first seed (no quality runs)."""
        return list(self._worker.request("tune_time", {"policy": policy.to_dict(), "repeat": repeat}, timeout=self.timeout))

    def risk(self, policy: Policy) -> list[dict[str, Any]]:
        return self._worker.request("tune_profile", {"policy": policy.to_dict()}, timeout=self.timeout)

    def validate(self, policy: Policy, seeds: Sequence[int]) -> dict[int, dict[str, float]]:
        """Seed -> quality of ``policy`` on ``seeds`` (their fp32 references computed on first use)."""
        raw = self._worker.request("tune_validate", {"policy": policy.to_dict(), "seeds": [int(s) for s in seeds]},
                                   timeout=self.timeout)
        return {int(seed): dict(q) for seed, q in raw.items()}

    def groups(self) -> list[str]:
        return _groups(self.ready["components"])

    def units(self) -> list[str]:
        return list(self.ready["units"])

    def sensitive(self) -> list[str]:
        """The pipeline's precision-sensitive module hints (for the presets)."""
        return list(self.ready.get("sensitive", []))

    def close(self) -> None:
        """Stop the worker process."""
        self._worker.close()

    def __enter__(self) -> WorkerEvaluator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- candidates and results ----------------------------------------------------------------


@dataclass
class TuneResult:
    """What :func:`tune` found.

    Attributes:
        policy: the chosen policy (name ``tuned``; every rule has a ``reason``).
        bound: the quality bound.
        objective: ``latency`` or ``memory``.
        met: whether the chosen policy meets the bound.
        chosen: the chosen candidate.
        closest: when nothing met the bound, the candidate closest to it.
        miss: how far ``closest`` misses the bound (``None`` when met).
        frontier: candidates non-dominated in (latency, memory, quality).
        evaluations: measured evaluations.
        cached: evaluations answered from the cache.
        wall_s: seconds the search took.
        path: every evaluated candidate, in order.
        notes: remarks on the search (fallbacks, budget exhausted...).
        final: candidate index -> seconds of the side-by-side re-timing of the
            finalists (empty when there was none).
        search_bound: the bound the search worked to: ``bound`` tightened by
            ``margin_db`` (:func:`tightened`); ``met`` on the path refers to it.
        margin_db: the margin, in dB of error.
        search_seeds: the seeds the search measured quality on.
        validation: the held-out check of the chosen policy (``None`` when validation
            was disabled or the evaluator cannot run other seeds): ``seeds``,
            ``worst`` (the bound metric's worst value over them), ``margin`` (how far
            ``worst`` is on the good side of ``bound``, in the metric's units),
            ``search_worst``, ``drop`` (search worst minus validation worst, in the
            good direction), ``met``, and ``tried``: every policy validated, in order
            (index, worst value, met, quality per seed).
        validations: policies measured on the validation seeds.
        seed_summary: for the chosen policy, per quality metric over every seed it
            was measured on (search and validation): ``worst``, ``median``,
            ``spread`` (max - min) and ``seeds``.
    """

    policy: Policy
    bound: Bound
    objective: str
    met: bool
    chosen: Candidate
    closest: Candidate | None
    miss: float | None
    frontier: list[Candidate]
    evaluations: int
    cached: int
    wall_s: float
    path: list[Candidate]
    notes: list[str] = field(default_factory=list)
    final: dict[int, list[float]] = field(default_factory=dict)
    search_bound: Bound | None = None
    margin_db: float = 0.0
    search_seeds: list[int] = field(default_factory=list)
    validation: dict[str, Any] | None = None
    validations: int = 0
    seed_summary: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        """The chosen policy's speed relative to fp32 (the baseline, path[0]).

        From the side-by-side re-timing when both were re-timed, else from the search's medians.
        """
        chosen = self.chosen.index
        if 0 in self.final and chosen in self.final:
            return statistics.median(self.final[0]) / max(statistics.median(self.final[chosen]), 1e-12)
        return self.path[0].evaluation.latency_s / max(self.chosen.evaluation.latency_s, 1e-12)

    @property
    def keep_fp32(self) -> list[str]:
        """Modules the chosen policy pins to fp32."""
        return [r.match for r in self.policy.rules if r.keep_fp32]

    def to_toml(self) -> str:
        """The chosen policy as TOML."""
        return self.policy.to_toml()

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain data (what the benchmark store keeps and ``--json`` prints)."""
        return {"bound": str(self.bound), "objective": self.objective, "met": self.met, "miss": self.miss,
                "chosen": self.chosen.index, "closest": self.closest.index if self.closest is not None else None,
                "frontier": [c.index for c in self.frontier], "evaluations": self.evaluations, "cached": self.cached,
                "wall_s": self.wall_s, "notes": list(self.notes), "policy": self.policy.to_dict(),
                "final": {str(k): v for k, v in self.final.items()},
                "search_bound": str(self.search_bound or self.bound), "margin_db": self.margin_db,
                "search_seeds": list(self.search_seeds), "validation": _plain_seeds(self.validation),
                "validations": self.validations, "seed_summary": self.seed_summary,
                "path": [c.to_dict() for c in self.path]}


def _plain_seeds(value: Any) -> Any:
    """Integer dict keys (seeds) as strings, as JSON writes them."""
    if isinstance(value, dict):
        return {str(k): _plain_seeds(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_seeds(v) for v in value]
    return value


def seed_summary(per_seed: dict[int, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per quality metric over the seeds: ``worst``, ``median``, ``spread`` (max - min), ``seeds``.

    Example:
        >>> seed_summary({0: {"sqnr_db": 41.0}, 1: {"sqnr_db": 43.0}, 2: {"sqnr_db": 42.5}})
        {'sqnr_db': {'worst': 41.0, 'median': 42.5, 'spread': 2.0, 'seeds': 3}}
    """
    keys = dict.fromkeys(k for q in per_seed.values() for k in q)
    out: dict[str, dict[str, float]] = {}
    for key in keys:
        values = [float(q[key]) for q in per_seed.values() if q.get(key) is not None]
        if not values:
            continue
        worst = worst_case([{key: v} for v in values])[key]
        high, low = max(values), min(values)
        spread = 0.0 if high == low else high - low  # inf - inf (every seed exact) is no spread
        out[key] = {"worst": worst, "median": statistics.median(values), "spread": spread, "seeds": len(values)}
    return out


def _needed(units: int) -> int:
    return 2 + math.ceil(math.log2(max(2, units))) + 1


def tune(
    pipeline: Any,
    bound: str | Bound,
    *,
    objective: str = "latency",
    budget: int | None = None,
    seeds: Sequence[int] = (0, 1),
    evaluator: Evaluator | None = None,
    store: Any = None,
    progress: Callable[[TuneProgress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    presets: Sequence[str] | None = None,
    size: str = "default",
    repeat: int = 3,
    hardware: Hardware | None = None,
    dtypes: Sequence[str] | None = None,
    local_search: bool = True,
    try_compile: bool = False,
    improvement: float = 0.03,
    final_rounds: int = 3,
    validation_seeds: int | Sequence[int] = 3,
    margin: float | None = None,
) -> TuneResult:
    """Find the fastest (or smallest) policy that meets ``bound``, by measurement.

    Args:
        pipeline: a registered pipeline name or a factory spec
            (``module.path:factory`` / ``path/to/file.py:factory``), measured in a
            :class:`WorkerEvaluator`; or anything used only to label the run when
            ``evaluator`` is given.
        bound: e.g. ``"sqnr>=30"`` (see :func:`parse_bound`).
        objective: ``latency`` (median seconds) or ``memory`` (weight bytes).
        budget: most measured evaluations (cache hits are free); ``None``: no limit.
        seeds: quality seeds (worst case over them) for the default evaluator.
        evaluator: how to measure; default ``WorkerEvaluator(pipeline, size, seeds, repeat)``.
        store: a :class:`mixprec.bench.store.Store` to reuse and keep measurements.
        progress: called with a :class:`TuneProgress` after each candidate.
        should_stop: checked before each measurement; when it returns true the
            search stops and the result holds what was measured (a note says so).
        presets: presets measured as candidates too, so the result is never worse
            than a measured preset; default: every preset when ``pipeline`` is a
            registered pipeline measured by the default evaluator, none otherwise.
        size: pipeline size for the default evaluator.
        repeat: timed runs per evaluation for the default evaluator.
        hardware: the probed device (default :func:`mixprec.device.hardware.probe`).
        dtypes: 16-bit storage types to try (default: those the probe measured fast).
        local_search: run the greedy local search after the bisection.
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
        margin: dB of error the search keeps below the bound (:func:`tightened`), so
            the answer is not tuned to the edge of what the search seeds allow;
            default :data:`DEFAULT_MARGIN_DB`; 0: search to the bound itself.

    Returns:
        A :class:`TuneResult`.

    Raises:
        ValueError: unknown objective or dtype, a bad bound, a negative margin, validation
            seeds shared with the search seeds, or a budget too small for baseline +
            all-16-bit + one bisection pass (the message says how many).
    """
    from mixprec.measure.machine import machine_fingerprint
    from mixprec.device.hardware import probe

    start = time.perf_counter()
    bound = parse_bound(bound)
    if objective not in ("latency", "memory"):
        raise ValueError(f"unknown objective {objective!r}; valid: latency, memory")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise ValueError(f"budget must be a positive number of evaluations or None, got {budget!r}")
    margin_db = DEFAULT_MARGIN_DB if margin is None else float(margin)
    search_bound = tightened(bound, margin_db)
    search_seeds = [int(x) for x in getattr(evaluator, "seeds", seeds)] if evaluator is not None else [int(x) for x in seeds]
    held_out = validation_seed_list(validation_seeds, search_seeds)
    hw = hardware if hardware is not None else probe()
    fast = list(dtypes) if dtypes is not None else hw.fast_16bit()
    notes: list[str] = []
    if margin_db:
        notes.append(f"search bound {search_bound}: {bound} with a {margin_db:g} dB margin")
    for d in fast:
        if d not in ("bf16", "fp16"):
            raise ValueError(f"unknown 16-bit dtype {d!r}; valid: bf16, fp16")
    if not fast:
        notes.append(f"no 16-bit type measured fast on {hw.name}: "
                     + ("16-bit storage with fp32 compute only" if objective == "memory"
                        else "16-bit compute cannot win on latency here, so the search covers fp32 settings and the presets"))
    owned = evaluator is None
    if owned:
        evaluator = WorkerEvaluator(str(getattr(pipeline, "name", pipeline)), size, seeds=seeds, repeat=repeat)
    try:
        units = evaluator.units()
        names = list(PRESETS) if presets is None and owned else list(presets or ())
        for name in names:
            if name not in PRESETS:
                raise ValueError(f"unknown preset {name!r}; valid: {', '.join(PRESETS)}")
        hints = tuple(evaluator.sensitive()) if hasattr(evaluator, "sensitive") else ()
        preset_policies = [(name, preset(name, hardware=hw, hints=hints)) for name in names]
        needed = _needed(len(units)) + len(preset_policies)
        if budget is not None and budget < needed:
            raise ValueError(f"budget={budget} is too small for one pass over {len(units)} modules: it needs at least "
                             f"{needed} evaluations (baseline + all-16-bit + {len(preset_policies)} presets + a bisection pass)")
        search = Search(evaluator, search_bound, objective, budget, store, progress, machine_fingerprint(hw), should_stop)
        try:
            run_search(search, evaluator, fast, notes, local_search, improvement, preset_policies, try_compile=try_compile)
        except BudgetExhausted:
            notes.append("stopped on request; the result holds what was measured" if search.cancelled
                         else f"budget of {budget} evaluations exhausted")
        final: dict[int, list[float]] = {}
        if objective == "latency" and final_rounds > 0 and hasattr(evaluator, "time") and not search.cancelled:
            contenders = finalists(search)
            if len(contenders) > 1:
                final = retime(evaluator, contenders, final_rounds)
                medians = ", ".join(f"#{i} {statistics.median(v) * 1e3:.1f} ms" for i, v in final.items())
                notes.append(f"final check: {len(contenders)} finalists re-timed side by side over {final_rounds} "
                             f"interleaved rounds (median): {medians}")
        if not search.path:
            raise ValueError("the search was stopped before its first evaluation; nothing was measured")
        best = _pick(search, final, improvement, notes)
        validation, summary, validations = None, {}, 0
        if best is not None and not search.cancelled:
            best, validation, summary, validations = _held_out(search, evaluator, bound, best, held_out,
                                                               search_seeds, notes)
    finally:
        if owned:
            evaluator.close()
    result = _result(search, bound, objective, notes, time.perf_counter() - start, final, best)
    result.search_bound, result.margin_db, result.search_seeds = search_bound, margin_db, search_seeds
    result.validation, result.seed_summary, result.validations = validation, summary, validations
    if validation is not None and not validation["met"]:
        result.met, result.miss = False, bound.miss({bound.key: validation["worst"]})
    if store is not None:
        label = str(getattr(pipeline, "name", pipeline))
        store.add_tune_run(pipeline=label, bound=str(bound), objective=objective, met=result.met,
                           evaluations=result.evaluations, cached=result.cached, wall_s=result.wall_s,
                           policy_toml=result.to_toml(), result=_jsonable(result.to_dict()))
    return result


def _jsonable(value: Any) -> Any:
    """Infinities and NaN as strings, so the stored JSON is standard."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _pick(search: Search, final: dict[int, list[float]], margin: float, notes: list[str]) -> Candidate | None:
    """The best candidate meeting the search bound: the side-by-side re-timing's winner when there was one."""
    best = search.best()
    if best is not None and final:
        # the presets and the fp32 baseline are the known answers: another policy must clearly beat them
        known = [i for i in final if i == 0 or search.path[i].step.startswith("preset ")]
        index, why = pick_final(final, known, margin=margin)
        best = search.path[index]
        notes.append(why)
    return best


#: Policies tried on the validation seeds before falling back to the fp32 baseline.
MAX_VALIDATION_TRIES = 4


def _fallbacks(search: Search, failed: Candidate) -> list[Candidate]:
    """What to validate after ``failed`` misses: frontier candidates meeting the search bound
    with more quality on the search seeds than ``failed``, cheapest first; then the baseline."""
    score = search.bound.score(failed.evaluation.quality)
    better = [c for c in frontier(search.path, search.bound)
              if c.met and c is not failed and search.bound.score(c.evaluation.quality) > score and c.index != 0]
    out = sorted(better, key=search.cost)[:MAX_VALIDATION_TRIES - 1]
    baseline = search.path[0]
    if baseline.met and failed is not baseline:
        out.append(baseline)
    return out


def _held_out(search: Search, evaluator: Any, bound: Bound, chosen: Candidate, seeds: Sequence[int],
              search_seeds: Sequence[int], notes: list[str]
              ) -> tuple[Candidate, dict[str, Any] | None, dict[str, dict[str, float]], int]:
    """Check ``chosen`` on the held-out seeds, stepping along the frontier while it misses.

    Returns the candidate finally chosen, the validation record (``None`` when not
    validated), its quality summary over every seed measured, and the number of
    policies measured on the validation seeds.
    """
    validate = getattr(evaluator, "validate", None)
    per_search = dict(chosen.evaluation.per_seed)
    if not seeds or validate is None:
        notes.append("warning: validation disabled (no validation seeds): the chosen policy was measured on the "
                     "search seeds only, so a new input may fall below the bound" if not seeds else
                     "warning: this evaluator cannot measure other seeds (no validate method): the chosen policy "
                     "was measured on the search seeds only")
        return chosen, None, seed_summary(per_search) if per_search else {}, 0
    tried: list[dict[str, Any]] = []
    queue = [chosen, *_fallbacks(search, chosen)]
    measured: list[tuple[Candidate, dict[int, dict[str, float]], dict[str, float]]] = []
    for cand in queue:
        if search.should_stop is not None and search.should_stop():
            notes.append("validation stopped on request: the policies tried so far are reported")
            break
        per_seed = validate(cand.policy, seeds)
        worst = worst_case(list(per_seed.values()))
        tried.append({"index": cand.index, "worst": worst.get(bound.key), "met": bound.met(worst), "per_seed": per_seed})
        measured.append((cand, per_seed, worst))
        if tried[-1]["met"]:
            break
    if not measured:
        return chosen, None, seed_summary(per_search) if per_search else {}, 0
    # the one that met, else the closest tried
    final, final_seeds, _ = max(measured, key=lambda m: (bound.met(m[2]), bound.score(m[2])))
    first = tried[0]
    if not first["met"] and tried[-1]["met"]:
        notes.append(f"#{chosen.index} ({chosen.step}) met {search.bound} on the search seeds but reached only "
                     f"{bound.key} {first['worst']:.4g} on a validation seed (bound {bound}); stepped to #{final.index} "
                     f"({final.step}), which meets it on all {len(seeds)} validation seeds")
    elif not first["met"]:
        notes.append(f"no candidate tried ({', '.join('#' + str(t['index']) for t in tried)}) meets {bound} on every "
                     f"validation seed; #{final.index} is the closest tried")
    if not final.evaluation.per_seed and search_seeds:  # reused from a store that kept no per-seed quality
        per_search = validate(final.policy, search_seeds)
    else:
        per_search = dict(final.evaluation.per_seed)
    worst_value = next(t["worst"] for t in tried if t["index"] == final.index)
    search_worst = final.evaluation.quality.get(bound.key)
    sign = 1.0 if bound.higher_is_better else -1.0
    margin = None if worst_value is None else sign * (worst_value - bound.value)
    drop = None if worst_value is None or search_worst is None else sign * (search_worst - worst_value)
    allowed = abs(search.bound.value - bound.value)
    chosen_worst = chosen.evaluation.quality.get(bound.key)
    first_drop = (sign * (chosen_worst - first["worst"])
                  if first["worst"] is not None and chosen_worst is not None else math.nan)
    if not first["met"] and math.isfinite(first_drop) and first_drop > allowed:
        notes.append(f"{bound.key} of #{chosen.index} dropped by {first_drop:.3g} from the search seeds' worst case to "
                     f"the validation seeds' worst case, more than the margin ({allowed:.3g}): a larger --margin "
                     f"suits this model's inputs")
    record = {"seeds": list(seeds), "worst": worst_value, "margin": margin, "search_worst": search_worst,
              "drop": drop, "met": bool(tried[-1]["met"]), "tried": tried}
    return final, record, seed_summary({**per_search, **final_seeds}), len(tried)


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


# -- HTML -------------------------------------------------------------------------------------


#: Plot colours: meets the bound, misses it, the chosen / best ring, the bound line.
_MET, _MISSED, _BEST, _BOUND = "#2a9d8f", "#e76f51", "#264653", "#e9c46a"


def tune_plot_png(path: Sequence[Candidate], bound: Bound, best: Candidate | None = None, *,
                  frontier: Sequence[Candidate] = (), legend: bool = False) -> bytes:
    """Candidates as points (latency in ms against the bound's metric), as PNG bytes.

    Green meets the bound, red misses it, the grey line is the search path, squares
    mark ``frontier``, the ring marks ``best`` and the dashed line is the bound. An
    infinite value (output identical to fp32) is drawn above the highest finite one;
    NaN is left out. Without ``legend`` the image holds numbers and the metric name
    only, so a caller can explain it in any language.
    """
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def value(c: Candidate) -> float:
        return c.evaluation.quality.get(bound.key, math.nan)

    finite = [v for v in map(value, path) if math.isfinite(v)]
    top = max(finite + [bound.value])
    cap = top + max(abs(top) * 0.1, 1e-3)
    points = {c.index: (c.evaluation.latency_s * 1e3, cap if math.isinf(value(c)) else value(c))
              for c in path if not math.isnan(value(c))}
    fig = Figure(figsize=(7, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    shown = [c for c in path if c.index in points]
    if shown:
        xs, ys = zip(*(points[c.index] for c in shown))
        ax.plot(xs, ys, color="#cccccc", linewidth=0.8, zorder=1, label="search path")
        ax.scatter(xs, ys, s=28, zorder=2, c=[_MET if c.met else _MISSED for c in shown])
        for c in shown:
            ax.annotate(str(c.index), points[c.index], fontsize=7, xytext=(3, 3), textcoords="offset points")
    front = [points[c.index] for c in frontier if c.index in points]
    if front:
        ax.scatter(*zip(*front), marker="s", s=70, facecolors="none", edgecolors="black", linewidths=1, zorder=3,
                   label="frontier (latency, memory, quality)")
    if best is not None and best.index in points:
        ax.scatter(*points[best.index], s=220, facecolors="none", edgecolors=_BEST, linewidths=2, zorder=3,
                   label="chosen")
    ax.axhline(bound.value, color=_BOUND, linewidth=1.2, linestyle="--", zorder=0, label=str(bound))
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.set_xlabel("ms")
    ax.set_ylabel(bound.key)
    if legend:
        ax.legend(fontsize=7)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    fig.clear()
    return buffer.getvalue()


def _num(value: float) -> str:
    return "exact" if value == math.inf else f"{value:.6g}"


def validation_text(result: TuneResult) -> str:
    """One sentence on the held-out check (English; the UI has its own translations)."""
    v = result.validation
    if v is None:
        return ("Not validated: the chosen policy was measured on the search seeds "
                f"{', '.join(map(str, result.search_seeds))} only.")
    worst = v["worst"]
    seeds = ", ".join(map(str, v["seeds"]))
    head = (f"On seeds {seeds}, never used by the search, the chosen policy "
            f"{'meets' if v['met'] else 'misses'} {result.bound}: worst {result.bound.key} "
            f"{_num(worst) if worst is not None else 'n/a'}")
    if worst is not None and math.isfinite(worst):
        head += f", {v['margin']:.3g} from the bound"
    if v.get("search_worst") is not None:
        head += f" (worst on the search seeds: {_num(v['search_worst'])})"
    return (f"{head}. The search worked to {result.search_bound} ({result.margin_db:g} dB margin) on seeds "
            f"{', '.join(map(str, result.search_seeds))}; {result.validations} "
            f"polic{'y' if result.validations == 1 else 'ies'} measured on the validation seeds.")


def render_tune_html(result: TuneResult) -> str:
    """A self-contained HTML page: candidates (latency vs quality), frontier, path, chosen policy."""
    import base64
    import html

    bound = result.bound
    front = result.frontier
    png = tune_plot_png(result.path, bound, result.chosen, frontier=front, legend=True)
    image = base64.b64encode(png).decode("ascii")
    esc = html.escape

    def shown(c: Candidate) -> str:
        v = c.evaluation.quality.get(bound.key, math.nan)
        return "exact" if math.isinf(v) and v > 0 else f"{v:.6g}"

    on_front = {c.index for c in front}
    rows = "".join(
        f"<tr{' class=chosen' if c is result.chosen else ''}><td>{c.index}</td><td>{esc(c.step)}</td>"
        f"<td>{c.evaluation.latency_s * 1e3:.2f}</td><td>{c.evaluation.memory_bytes / 2**20:.1f}</td>"
        f"<td>{esc(shown(c))}</td><td>{'yes' if c.met else 'no'}</td><td>{'yes' if c.index in on_front else ''}</td>"
        f"<td>{'store' if c.cached else 'measured'}</td></tr>" for c in result.path)
    final = ""
    if result.final:
        n = max(len(v) for v in result.final.values())
        heads = "".join(f"<th>round {k + 1} ms</th>" for k in range(n))
        final_rows = "".join(
            f"<tr{' class=chosen' if i == result.chosen.index else ''}><td>{i}</td><td>{esc(result.path[i].step)}</td>"
            + "".join(f"<td>{v * 1e3:.1f}</td>" for v in seconds)
            + f"<td>{statistics.median(seconds) * 1e3:.1f}</td></tr>"
            for i, seconds in result.final.items())
        final = ("<h2>Final check: the finalists re-timed side by side</h2>"
                 f"<table><tr><th>#</th><th>step</th>{heads}<th>median ms</th></tr>{final_rows}</table>")
    status = "met" if result.met else f"not met (closest misses by {result.miss:.4g})"
    held_out = f"<h2>Validation on held-out seeds</h2><p>{esc(validation_text(result))}</p>"
    if result.seed_summary:
        summary_rows = "".join(
            f"<tr><td>{esc(metric)}</td><td>{_num(v['worst'])}</td><td>{_num(v['median'])}</td>"
            f"<td>{_num(v['spread'])}</td><td>{int(v['seeds'])}</td></tr>" for metric, v in result.seed_summary.items())
        held_out += ("<p>How sure: the chosen policy's quality over every seed it was measured on.</p>"
                     "<table><tr><th>metric</th><th>worst</th><th>median</th><th>spread</th><th>seeds</th></tr>"
                     f"{summary_rows}</table>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>mixprec tune</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;text-align:right}"
        "td:nth-child(2),th:nth-child(2){text-align:left}tr.chosen{font-weight:bold;background:#e8f4f2}"
        "pre{background:#f4f4f4;padding:1em}</style></head><body>"
        f"<h1>mixprec tune: {esc(str(bound))} ({esc(result.objective)})</h1>"
        f"<p>Bound {esc(status)}; {result.evaluations} measured evaluations, {result.cached} reused from the store, "
        f"{result.wall_s:.1f} s. Chosen: #{result.chosen.index} ({esc(result.chosen.step)}).</p>"
        + "".join(f"<p>{esc(n)}</p>" for n in result.notes)
        + f"<img alt='candidates' src='data:image/png;base64,{image}'>"
        f"{held_out}<h2>Chosen policy</h2><pre>{esc(result.to_toml())}</pre>{final}"
        "<h2>Path</h2><table><tr><th>#</th><th>step</th><th>latency ms</th><th>weights MiB</th>"
        f"<th>{esc(bound.key)}</th><th>meets</th><th>frontier</th><th>source</th></tr>{rows}</table></body></html>"
    )
