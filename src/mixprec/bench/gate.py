"""Compare two benchmark runs, and gate a run against a baseline for CI.

The gate implements the rollback triggers apps ask for: quality drop, latency
regression, memory increase and failure rate beyond given thresholds. Configurations
are matched by (name, batch).

Speed is decided on intervals only (:mod:`mixprec.bench.evidence`): a configuration's
speed-up against its own run's fp32 from paired rounds, and its median latency's 95 %
interval. A change is called where the intervals support it; where they cannot tell,
:func:`compare` says "undecided on this machine" and the gate warns (or fails with
``fail_undecided``), but a regression the intervals support always fails.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from mixprec._quote import few, quote
from mixprec.bench import evidence, rundata
from mixprec.bench.comparable import baseline_problems, comparable, nothing_in_common
from mixprec.bench.comparable import index as _index
from mixprec.bench.runstate import (NO_REFERENCE, NOT_MEASURED, OLDER, PARTLY, UNFINISHED, UNTIMED, classify, main_quality,
                                    shown_status, unmeasured)
from mixprec.bench.runstate import failure as _failure
from mixprec.bench.runstate import number as _number
from mixprec.measure.stats import MEMORY_FLOOR_BYTES, memory_beyond_noise

__all__ = ["SIZE_UNITS", "Thresholds", "GateResult", "check", "gate", "compare", "comparable", "main_quality", "parse_percent",
           "parse_db", "parse_bytes", "thresholds_from_flags"]


def parse_percent(text: str, flag: str, *, upper: float | None = None) -> float:
    """``"5%"`` -> 0.05; the unit is required and the value bounded; errors name the flag.

    A bare number is refused: ``--max-quality-drop 5`` could mean 5% or 500%.

    Args:
        text: what the user wrote.
        flag: the option's name, for the message.
        upper: the largest allowed fraction (1.0 for rates: 100%); ``None`` for no bound.
    """
    raw = str(text).strip()
    if not raw.endswith("%"):
        try:
            float(raw)
        except ValueError:
            raise ValueError(f"{flag} {quote(text)}: expected a percentage such as 5%") from None
        raise ValueError(f"{flag} {quote(text)}: give the unit, for example {raw if len(raw) <= 20 else 5}% (a bare number is ambiguous)")
    try:
        value = float(raw[:-1]) / 100
    except ValueError:
        raise ValueError(f"{flag} {quote(text)}: expected a percentage such as 5%") from None
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise ValueError(f"{flag} {quote(text)}: must be a finite percentage of 0% or more")
    if upper is not None and value > upper:
        raise ValueError(f"{flag} {quote(text)}: must be between 0% and {upper:.0%}")
    return value


def parse_db(text: str, flag: str) -> float:
    """``"40dB"``, ``"40 dB"`` or ``"40"`` -> 40.0 (a finite number of decibels); errors name the flag."""
    raw = str(text).strip()
    number = raw[:-2].strip() if raw.lower().endswith("db") else raw
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{flag} {quote(text)}: expected decibels such as 40dB") from None
    if not math.isfinite(value):
        raise ValueError(f"{flag} {quote(text)}: must be a finite number of decibels such as 40dB")
    return value


#: The units a size may be given in (any case) -> bytes.
SIZE_UNITS: dict[str, int] = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
_UNITS = {unit.lower(): size for unit, size in SIZE_UNITS.items()}


def parse_bytes(text: str, flag: str) -> float:
    """``"8MiB"`` -> 8388608; units B, KiB, MiB, GiB, KB, MB, GB; a bare ``0`` needs none."""
    raw = str(text).strip()
    match = re.fullmatch(r"([0-9.eE+-]+)\s*([A-Za-z]*)", raw)
    try:
        value = float(match.group(1)) if match else None
    except ValueError:
        value = None
    unit = match.group(2).lower() if match else ""
    if value is None or (unit and unit not in _UNITS):
        raise ValueError(f"{flag} {quote(text)}: expected a size such as 8MiB (units: {', '.join(SIZE_UNITS)})")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{flag} {quote(text)}: must be a finite size of 0 or more, such as 8MiB")
    if not unit and value != 0:
        raise ValueError(f"{flag} {quote(text)}: give the unit, for example {raw if len(raw) <= 20 else 8}MiB (a bare number is ambiguous)")
    return value * _UNITS.get(unit, 1)


def thresholds_from_flags(*, max_quality_drop: str, max_latency_regression: str, max_memory_increase: str,
                          max_failure_rate: str, min_quality: str | None = None,
                          memory_noise_floor: str = "8MiB", fail_undecided: bool = False) -> "Thresholds":
    """Thresholds from the CLI's flags: every one needs its unit; rates and drops are 0-100%."""
    return Thresholds(
        max_quality_drop=parse_percent(max_quality_drop, "--max-quality-drop", upper=1.0),
        max_latency_regression=parse_percent(max_latency_regression, "--max-latency-regression"),
        max_memory_increase=parse_percent(max_memory_increase, "--max-memory-increase"),
        max_failure_rate=parse_percent(max_failure_rate, "--max-failure-rate", upper=1.0),
        min_quality_db=None if min_quality is None else parse_db(min_quality, "--min-quality"),
        memory_floor_bytes=parse_bytes(memory_noise_floor, "--memory-noise-floor"),
        fail_undecided=fail_undecided,
    )


@dataclass(frozen=True)
class Thresholds:
    """What the gate allows.

    Attributes:
        max_quality_drop: fraction the main quality figure (dB) may drop by.
        max_latency_regression: fraction a configuration may be slower by.
        max_memory_increase: fraction peak memory and weight bytes may grow by.
        max_failure_rate: fraction of configurations that may fail.
        min_quality_db: an absolute floor on the main quality figure. Against an exact
            baseline (``inf``: fp32 against itself) any finite quality is a drop that no
            percentage allows; a floor lets quality at or above it pass.
        memory_floor_bytes: peak memory readings move by a few MiB between identical
            runs; an increase must exceed this as well as ``max_memory_increase``
            (weight bytes are counted exactly and get no floor).
        fail_undecided: fail where the intervals can neither support nor exclude a
            latency regression (by default such checks pass with a warning).
    """

    max_quality_drop: float = 0.05
    max_latency_regression: float = 0.10
    max_memory_increase: float = 0.0
    max_failure_rate: float = 0.01
    min_quality_db: float | None = None
    memory_floor_bytes: float = MEMORY_FLOOR_BYTES
    fail_undecided: bool = False

    def __post_init__(self) -> None:
        for name in ("max_quality_drop", "max_latency_regression", "max_memory_increase", "max_failure_rate",
                     "memory_floor_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"Thresholds.{name} must be a finite number of 0 or more, got {value!r}")
        if self.min_quality_db is not None and not (isinstance(self.min_quality_db, (int, float))
                                                    and math.isfinite(self.min_quality_db)):
            raise ValueError(f"Thresholds.min_quality_db must be a finite number of dB or None, got {self.min_quality_db!r}")


@dataclass(frozen=True)
class GateResult:
    """``violations`` fail the gate; ``undecided`` are checks the measurements could not
    decide (they fail too where :attr:`Thresholds.fail_undecided` is set); ``unusable`` says why
    the gate cannot decide at all (a baseline with nothing to compare against, a run that did not
    finish, runs that do not compare): the gate does not pass then either; ``notes`` say what the
    verdict does not cover (the run's configurations that did not run in the baseline, a run stored
    without its device)."""

    violations: list[str] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)
    unusable: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.violations and not self.unusable


def _distinct(a: float, b: float, decimals: int) -> tuple[str, str]:
    """``a`` and ``b`` rounded alike, with as many decimals as it takes to tell them apart
    (a message never shows two equal figures as a change)."""
    for places in range(decimals, 10):
        ta, tb = f"{a:.{places}f}", f"{b:.{places}f}"
        if ta != tb or a == b:
            return ta, tb
    return repr(a), repr(b)


def _pct_over(value: float, limit: float) -> str:
    """``+12.5% > 10.0%``, with enough decimals that the two figures differ."""
    for places in range(1, 8):
        tv, tl = f"{value:.{places}%}", f"{limit:.{places}%}"
        if tv != tl:
            return f"+{tv} > {tl}"
    return f"+{value!r} > {limit!r}"


def _db(value: float) -> str:
    return "exact (inf)" if value == math.inf else f"{value:.2f} dB"


def _quality(label: str, cfg: dict[str, Any], ref: dict[str, Any], t: Thresholds) -> list[str]:
    old = main_quality(ref["metrics"])
    if old is None:
        return []  # the baseline holds the run to no quality figure
    name, old_v = old
    new_v = _number(cfg["metrics"], name)
    if math.isnan(old_v):
        return [f"{label}: could not check quality: the baseline's {name} is nan"]
    if new_v is None or math.isnan(new_v):
        got = "none (not measured, or NaN)" if new_v is None else "nan"
        return [f"{label}: could not check quality: the baseline has {name} {_db(old_v)}, the run {got} "
                "(an output that could not be compared with fp32's, such as one of another shape, fails)"]
    if old_v == math.inf:
        if new_v == math.inf or t.min_quality_db is not None:
            return []  # exact again, or the floor decides (see _floor)
        return [f"{label}: quality {name} {new_v:.2f} dB vs exact (inf) in the baseline: a drop from an exact match is "
                "a regression that no --max-quality-drop allows; pass --min-quality DB to accept quality at or above a floor"]
    if old_v == -math.inf:
        return []
    drop = (old_v - new_v) / abs(old_v) if old_v else (math.inf if new_v < old_v else 0.0)
    if drop <= t.max_quality_drop:
        return []
    new_t, old_t = _distinct(new_v, old_v, 2)
    return [f"{label}: quality {name} {new_t} vs {old_t} (drop {_pct_over(drop, t.max_quality_drop)[1:]})"]


def _floor(label: str, cfg: dict[str, Any], t: Thresholds) -> list[str]:
    if t.min_quality_db is None:
        return []
    quality = main_quality(cfg["metrics"])
    if quality is None or math.isnan(quality[1]):
        return [f"{label}: could not check --min-quality {t.min_quality_db:g} dB: no quality figure"]
    name, value = quality
    if value >= t.min_quality_db:
        return []
    value_t, floor_t = _distinct(value, t.min_quality_db, 2)
    return [f"{label}: quality {name} {value_t} dB < --min-quality {floor_t} dB"]


def _latency(label: str, run: dict[str, Any], cfg: dict[str, Any], baseline: dict[str, Any], ref: dict[str, Any],
             t: Thresholds, *, same_machine: bool) -> tuple[list[str], list[str]]:
    """(violations, undecided) of the latency check of one configuration."""
    allowed = t.max_latency_regression
    old_l, new_l = evidence.latency(ref), evidence.latency(cfg)
    reference = evidence.reference(run, cfg["batch"])
    # The reference's speed-up is 1 by definition: only its latency can tell.
    is_reference = reference is not None and reference["name"] == cfg["name"]
    old_s, new_s = (None, None) if is_reference else (evidence.speedup(baseline, ref), evidence.speedup(run, cfg))
    if old_l is None and old_s is None:
        return [], []  # the baseline timed nothing to hold the run to
    if not same_machine and old_l is not None and new_l is not None:
        # Seconds on another machine say little about the code: where the speed-ups
        # against each run's own fp32 can compare, only they do.
        if is_reference:
            return [], [f"{label}: latency not compared: the run and the baseline were measured on different machines "
                        "(only each configuration's speed-up against its own run's fp32 is)"]
        if old_s is not None and new_s is not None:
            old_l = new_l = None
    by_speed = evidence.regression(old_s, new_s, allowed, higher_is_slower=False)
    by_latency = evidence.regression(old_l, new_l, allowed, higher_is_slower=True)
    if by_speed is None and by_latency is None:
        return [f"{label}: could not check latency: the baseline was timed, the run has no timing that compares with it"], []
    speed_text = (f"speed-up vs its fp32 {new_s.text()} vs {old_s.text()} in the baseline"
                  if old_s is not None and new_s is not None else "")
    latency_text = ""
    if old_l is not None and new_l is not None:
        new_t, old_t = _distinct(new_l.value, old_l.value, 4)
        latency_text = f"latency {new_t} s vs {old_t} s ({new_l.value / old_l.value - 1:+.1%})"
    if "regression" in (by_speed, by_latency):
        parts = []
        if by_latency == "regression":
            parts.append(f"{latency_text}: its 95% interval {new_l.low:.4g}-{new_l.high:.4g} s lies above the baseline's "
                         f"{old_l.low:.4g}-{old_l.high:.4g} s plus {allowed:.1%}")
        if by_speed == "regression":
            parts.append(f"{speed_text}: more than {allowed:.1%} slower over the whole interval")
        elif by_speed == "ok":
            parts.append(f"its {speed_text} shows no regression: the whole run ran slower (a busier machine, "
                         "or fp32 itself slower)")
        return [f"{label}: " + "; ".join(parts)], []
    if "ok" in (by_speed, by_latency):
        return [], []
    shown = ", ".join(p for p in (latency_text, speed_text) if p)
    flagged = [which for which, c in (("run", cfg), ("baseline", ref)) if (_number(c["metrics"], "unstable") or 0) > 0]
    unstable = f"; its timings in the {' and the '.join(flagged)} were flagged unstable" if flagged else ""
    return [], [f"{label}: latency regression beyond {allowed:.1%} undecided on this machine ({shown}): the intervals "
                f"neither exclude nor support it{unstable}; re-run with more --repeat, or on a quieter machine"]


def _memory(label: str, cfg: dict[str, Any], ref: dict[str, Any], t: Thresholds) -> list[str]:
    violations = []
    # Peak memory readings (RSS, allocator peaks) move between identical runs; weight bytes are exact.
    for metric, floor in (("peak_mem_bytes", t.memory_floor_bytes), ("weight_bytes", 0.0)):
        old_b, new_b = _number(ref["metrics"], metric), _number(cfg["metrics"], metric)
        if old_b is None or not math.isfinite(old_b):
            continue
        if new_b is None or math.isnan(new_b):
            violations.append(f"{label}: could not check {metric}: the baseline has {old_b / 2**20:.1f} MiB, the run none")
            continue
        if not memory_beyond_noise(old_b, new_b, t.max_memory_increase, floor_bytes=floor):
            continue
        new_t, old_t = _distinct(new_b / 2**20, old_b / 2**20, 1)
        increase = new_b / old_b - 1 if old_b else math.inf
        over = _pct_over(increase, t.max_memory_increase)
        noise = f", and more than the {floor / 2**20:g} MiB noise floor" if floor else ""
        violations.append(f"{label}: {metric} {new_t} MiB vs {old_t} MiB ({over}{noise})")
    return violations


def check(run: dict[str, Any], baseline: dict[str, Any], thresholds: Thresholds, *,
          allow_different_machine: bool = False) -> GateResult:
    """Check ``run`` against ``baseline``: every violation of ``thresholds``, and what could not be decided.

    The gate never passes what it could not check. It cannot decide at all (``unusable``) on
    a baseline that holds the run to nothing (its state, :func:`mixprec.bench.runstate.classify`:
    unfinished, nothing measured, no fp32 reference, nothing timed), a run that did not finish
    or runs that do not compare (see :func:`comparable`). A run with no timed run or no fp32 reference, a
    configuration of the baseline missing from the run, a configuration with fewer
    samples than asked (``partial``), a quality, latency or memory figure the baseline
    has and the run lacks, and a run in which every configuration failed (whatever
    ``max_failure_rate`` allows) are violations. A configuration whose output has
    another shape than fp32's, or that lacks the quality figure its baseline has,
    counts as failed.

    Quality: a drop beyond ``max_quality_drop``; against an exact baseline (``inf``) any
    finite figure fails unless ``min_quality_db`` is set, which then applies to every
    configuration. Latency: a regression beyond ``max_latency_regression`` fails where
    the intervals support it (the speed-up against the run's own fp32 from paired rounds,
    or the median latency's interval); where they can neither support nor exclude it the
    check is ``undecided`` (a violation only with ``fail_undecided``); against a baseline
    from another machine (``allow_different_machine``) only the speed-ups compare. Memory: an
    increase beyond ``max_memory_increase`` and, for peak memory, beyond
    ``memory_floor_bytes``.
    """
    violations: list[str] = []
    unusable = baseline_problems(run, baseline)
    run_state = classify(run)
    if set(run_state.states) & UNFINISHED:
        unusable.append(f"run {run.get('id', '?')} cannot be gated: {run_state.text}")
    unusable += comparable(run, baseline, allow_different_machine=allow_different_machine)
    # What the verdict rests on besides: configurations that did not run, a run stored without its device.
    notes = [f"{label} {state.run_id} is {kind}: {why}" for label, state in (("run", run_state), ("baseline", classify(baseline)))
             for kind, why in state.problems if kind in (PARTLY, OLDER)]
    if not run["configs"]:
        violations.append(f"run {run.get('id', '?')} has no configuration: it measured nothing")
    # A baseline the gate cannot decide on holds the run to nothing: only the run's own checks are made.
    base = {} if unusable else _index(baseline)
    # A configuration that did not run in the baseline holds the run to nothing, so it may be left out.
    own = _index(run)
    missing = sorted(key for key, ref in base.items() if key not in own and _failure(ref) is None)
    if missing:
        violations.append("configurations of the baseline missing from the run: "
                          + few(missing, show=lambda key: f"{key[0]}@{key[1]}"))
    configs = run["configs"]
    failed = [(c, why) for c in configs if (why := _failure(c, base.get((c["name"], c["batch"])))) is not None]
    rate = len(failed) / len(configs) if configs else 1.0
    if rate > thresholds.max_failure_rate:
        names = few(failed, show=lambda item: f"{item[0]['name']}@{item[0]['batch']} ({item[1]})")
        violations.append(f"failure rate {rate:.1%} > {thresholds.max_failure_rate:.1%}: {names}")
    if configs and len(failed) == len(configs):
        violations.append(f"every configuration of run {run.get('id', '?')} failed, {evidence.REFERENCE} included: "
                          "nothing was measured, whatever --max-failure-rate allows")
    elif NO_REFERENCE in run_state.states:
        violations.append(f"run {run.get('id', '?')}: {dict(run_state.problems)[NO_REFERENCE]}")
    if UNTIMED in run_state.states:
        violations.append(f"run {run.get('id', '?')} has no timed run: its speed cannot be checked")
    undecided: list[str] = []
    fingerprints = run.get("machine_fingerprint"), baseline.get("machine_fingerprint")
    same_machine = ((not all(fingerprints) or fingerprints[0] == fingerprints[1])
                    and rundata.devices_differ(run, baseline) is None)  # a CPU and a GPU of one host are two machines
    for key, cfg in own.items():
        ref = base.get(key)
        label = f"{key[0]}@batch {key[1]}"
        if cfg.get("status") != "ok" or unmeasured(cfg) is not None:
            continue  # counted by the failure rate: a status other than ok, or an ok whose rows hold no measurement
        violations += _floor(label, cfg, thresholds)
        if ref is None or _failure(ref) is not None:
            if ref is not None:
                notes.append(f"{label}: not checked: it did not run to the end in the baseline ({_failure(ref)})")
            continue
        violations += _quality(label, cfg, ref, thresholds)
        slow, unsure = _latency(label, run, cfg, baseline, ref, thresholds, same_machine=same_machine)
        violations += slow
        undecided += unsure
        violations += _memory(label, cfg, ref, thresholds)
    if thresholds.fail_undecided:
        violations += [f"{u} (--fail-undecided)" for u in undecided]
    return GateResult(violations, undecided, unusable, notes)


def gate(run: dict[str, Any], baseline: dict[str, Any], thresholds: Thresholds, *,
         allow_different_machine: bool = False) -> list[str]:
    """Why the gate cannot decide, and every violation of ``thresholds`` by ``run`` against ``baseline``
    (empty: pass); see :func:`check`."""
    result = check(run, baseline, thresholds, allow_different_machine=allow_different_machine)
    return result.unusable + result.violations


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Per configuration: latency, speed-up, quality and memory of run ``b`` against run ``a``.

    Each change carries what the intervals support (:func:`mixprec.bench.evidence.change`):
    ``latency_verdict`` compares the two runs' median-latency intervals ("slower",
    "faster", "within noise" or "undecided on this machine"), and ``speedup_verdict``
    compares the configuration's speed-up against its own run's fp32, from paired rounds
    ("faster", "slower", "within noise", "undecided on this machine", or "reference" for
    fp32 itself). Absolute latencies taken at different times include the machine's load;
    the speed-up does not, so it alone decides ``beyond_noise``.
    ``latency_significant`` is true where the latency intervals do not overlap.

    Every row carries each run's state (``state_a``, ``state_b``: :func:`mixprec.bench.runstate.classify`)
    and whether its figures are a final result (``final_a``, ``final_b``). A configuration marked ``ok``
    whose stored rows hold no measurement (:func:`mixprec.bench.runstate.unmeasured`) has the status
    ``not measured``, its reason in ``not_measured_a`` / ``not_measured_b``, and both verdicts ``not measured``.

    Runs measured on different devices (a CPU run and a CUDA run, even on one host) are
    never compared as one machine: every row then carries ``device_a`` and ``device_b``,
    and its ``latency_verdict`` is :data:`~mixprec.bench.evidence.OTHER_DEVICE` (the
    seconds are shown, not judged); only the speed-ups against each run's own fp32 compare.

    Raises:
        ValueError: runs of another pipeline or size, or runs with no (configuration, batch)
            in common, with the reason (:func:`~mixprec.bench.comparable.nothing_in_common`).
    """
    problems = comparable(b, a, allow_different_machine=True)
    if any("pipeline" in p or "size" in p for p in problems):
        raise ValueError("cannot compare these runs: " + "; ".join(problems))
    if (reason := nothing_in_common(a, b)) is not None:
        raise ValueError(f"nothing to compare between run {a.get('id', '?')} and run {b.get('id', '?')}: {reason}")
    devices = rundata.devices_differ(a, b)
    states = classify(a), classify(b)
    rows = []
    index_a = _index(a)
    for key, cfg_b in _index(b).items():
        cfg_a = index_a.get(key)
        if cfg_a is None:
            continue
        ma, mb = cfg_a["metrics"], cfg_b["metrics"]
        row: dict[str, Any] = {"config": key[0], "batch": key[1], "status_a": shown_status(cfg_a), "status_b": shown_status(cfg_b),
                               "state_a": states[0].state, "state_b": states[1].state,
                               "final_a": states[0].final, "final_b": states[1].final}
        la, lb = evidence.latency(cfg_a), evidence.latency(cfg_b)
        if la is not None and lb is not None:
            row["latency_a"], row["latency_b"] = la.value, lb.value
            row["latency_change"] = lb.value / la.value - 1 if la.value else math.inf
            row["latency_ci_a"], row["latency_ci_b"] = [la.low, la.high], [lb.low, lb.high]
            row["latency_verdict"] = (evidence.OTHER_DEVICE if devices is not None else
                                      evidence.change(la, lb, more=evidence.SLOWER, less=evidence.FASTER))
            row["latency_significant"] = row["latency_verdict"] in (evidence.SLOWER, evidence.FASTER)
        if devices is not None:
            row["device_a"], row["device_b"] = devices
        refs = [evidence.reference(run, key[1]) for run in (a, b)]
        if all(r is not None and r["name"] == key[0] for r in refs):
            row["speedup_verdict"] = "reference"
        else:
            sa, sb = evidence.speedup(a, cfg_a), evidence.speedup(b, cfg_b)
            if sa is not None:
                row["speedup_a"] = sa.to_dict()
            if sb is not None:
                row["speedup_b"] = sb.to_dict()
            if sa is not None and sb is not None:
                row["speedup_change"] = sb.value / sa.value - 1 if sa.value else math.inf
                row["speedup_verdict"] = evidence.change(sa, sb, more=evidence.FASTER, less=evidence.SLOWER)
        missing = {side: why for side, cfg in (("a", cfg_a), ("b", cfg_b)) if (why := unmeasured(cfg)) is not None}
        if missing:
            # Marked ok, but its stored rows hold no measurement: its figures are shown, no change is called on them.
            row.update({f"not_measured_{side}": why for side, why in missing.items()})
            row["latency_verdict"] = row["speedup_verdict"] = NOT_MEASURED
            row["latency_significant"] = False
        row["beyond_noise"] = row.get("speedup_verdict") in (evidence.FASTER, evidence.SLOWER)
        for side, metrics in (("a", ma), ("b", mb)):
            unstable = _number(metrics, "unstable")
            if unstable is not None:
                row[f"unstable_{side}"] = unstable > 0  # the runner's flag: spread (CV) or drift beyond its limits
        qa, qb = main_quality(ma), main_quality(mb)
        if qa and qb and qa[0] == qb[0]:
            row["quality_metric"], row["quality_a"], row["quality_b"] = qa[0], qa[1], qb[1]
        if ma.get("peak_mem_bytes") is not None and mb.get("peak_mem_bytes") is not None:
            row["peak_mem_a"], row["peak_mem_b"] = ma["peak_mem_bytes"], mb["peak_mem_bytes"]
        rows.append(row)
    return rows
