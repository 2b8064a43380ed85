"""What :func:`~mixprec.tuning.tuner.tune` returns: :class:`TuneResult`, its plain-data form,
and :func:`jsonable` for standard JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mixprec._json import strict
from mixprec.measure.stats import Ratio, paired_ratio
from mixprec.policy import Policy
from mixprec.tuning.bounds import Bound
from mixprec.tuning.candidates import Candidate

__all__ = ["TuneResult", "jsonable"]


@dataclass
class TuneResult:
    """What :func:`~mixprec.tuning.tuner.tune` found.

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
            ``margin_db`` (:func:`~mixprec.tuning.bounds.tightened`); ``met`` on the path refers to it.
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
        device: the device the candidates were measured on (``cpu``, ``cuda``, ``cuda:1``);
            a policy tuned on one device says nothing of its speed on another.
        status: ``complete``; ``cancelled`` (stopped on request: ``should_stop``) or
            ``incomplete`` (interrupted: Ctrl-C), when it holds only what was measured before.
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
    device: str | None = None
    status: str = "complete"

    @property
    def speed(self) -> Ratio | None:
        """The chosen policy's speed relative to fp32 from the side-by-side re-timing's
        paired rounds, with its interval; None where the two were not re-timed together."""
        chosen = self.chosen.index
        if 0 in self.final and chosen in self.final and self.final[0] and self.final[chosen]:
            return paired_ratio(self.final[0], self.final[chosen])
        return None

    @property
    def speedup(self) -> float:
        """The chosen policy's speed relative to fp32 (the baseline, path[0]).

        From the side-by-side re-timing's paired rounds when both were re-timed, else
        from the search's medians (taken at different moments: less reliable).
        """
        speed = self.speed
        if speed is not None:
            return speed.value
        return self.path[0].evaluation.latency_s / max(self.chosen.evaluation.latency_s, 1e-12)

    def speed_text(self) -> str:
        """``1.42x (1.31-1.55) the speed of fp32 (final check, paired rounds)``, or what could be said."""
        speed = self.speed
        if self.chosen.index == 0:
            return "fp32 itself"
        if speed is None:  # medians taken at different moments: no interval, so no speed-up is claimed
            return ("undecided against fp32: not re-timed side by side (the search's medians, taken at different "
                    f"moments, give {self.speedup:.2f}x the speed of fp32)")
        verdict = speed.verdict()
        tail = {"above": "faster than fp32", "below": "slower than fp32",
                "undecided": "undecided against fp32 on this machine"}[verdict]
        return f"{speed.text()} the speed of fp32 over {speed.n} paired rounds: {tail}"

    @property
    def keep_fp32(self) -> list[str]:
        """Modules the chosen policy pins to fp32."""
        return [r.match for r in self.policy.rules if r.keep_fp32]

    def to_toml(self) -> str:
        """The chosen policy as TOML."""
        return self.policy.to_toml()

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain data (what the benchmark store keeps and ``--json`` prints)."""
        return {"bound": str(self.bound), "objective": self.objective, "device": self.device, "met": self.met, "miss": self.miss,
                "chosen": self.chosen.index, "closest": self.closest.index if self.closest is not None else None,
                "frontier": [c.index for c in self.frontier], "evaluations": self.evaluations, "cached": self.cached,
                "wall_s": self.wall_s, "notes": list(self.notes), "policy": self.policy.to_dict(),
                "final": {str(k): v for k, v in self.final.items()},
                "search_bound": str(self.search_bound or self.bound), "margin_db": self.margin_db,
                "search_seeds": list(self.search_seeds), "validation": _plain_seeds(self.validation),
                "validations": self.validations, "seed_summary": self.seed_summary, "status": self.status,
                "path": [c.to_dict() for c in self.path]}


def _plain_seeds(value: Any) -> Any:
    """Integer dict keys (seeds) as strings, as JSON writes them."""
    if isinstance(value, dict):
        return {str(k): _plain_seeds(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_seeds(v) for v in value]
    return value


def jsonable(value: Any) -> Any:
    """Infinities and NaN as strings, so the stored JSON is standard (:func:`mixprec._json.strict`)."""
    return strict(value)
