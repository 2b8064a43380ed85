"""Which configuration to use on the machine a run measured, and how sure that is: one headline per pipeline and batch.

:func:`headlines` reads a stored run (the dict :meth:`~mixprec.bench.store.Store.load_run` returns) and
nothing else. Per batch size it chooses among the configurations that met their quality:

- the configuration ran to the end (status ``ok``), its output was finite and of fp32's shape
  (:func:`mixprec.bench.runstate.failure`);
- its output is not fp32's bit for bit (:data:`SAME_AS_FP32`: such a configuration computes what fp32
  computes, a matmul level that changes nothing on the machine, say, and any speed-up it shows is noise);
- its main quality figure (the one the table shows: SNR, PSNR, else SQNR against fp32) reaches its
  floor: a mixprec preset's own (:data:`mixprec.calibration.FLOORS_DB`: ``quality`` must be exact,
  ``balanced`` 25 dB, ``fast`` and ``memory`` 20 dB, with or without ``+compile`` / ``+calibrated``),
  every other configuration the most permissive preset's (20 dB).

Of those, the fastest whose paired speed-up against fp32 is decided faster (a 95% interval wholly
above 1, timings not flagged unstable) is the choice (:data:`DECIDED`). A speed-up the table shows
as a figure from the range of fewer rounds than a 95% interval needs (every round faster, but
three rounds all faster happen one time in eight by chance) is not decided here. Where none is
decided, the fastest measured above 1 is named as :data:`INDICATIVE`, with how many rounds it
rests on; where none was measured faster, the headline
says to keep fp32 (:data:`KEEP`), naming what was faster but fell short of its quality. A run that is
not a final result (:func:`~mixprec.bench.runstate.classify`) says so first.

Example::

    tts, batch 1: use naive-bf16: 2.04x (1.94–2.25) against fp32, decided: 95% interval of 8 paired rounds;
    weights 282.1 MiB (fp32: 564.1 MiB); SNR 38.0 dB (floor 20 dB)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from mixprec._quote import clip, few
from mixprec.bench import evidence, rundata
from mixprec.bench.evidence import Interval
from mixprec.bench.runstate import UNFINISHED, classify, failure, main_quality, number
from mixprec.bench.table import COLUMNS, render_table_rows

__all__ = ["Headline", "headlines", "headline_lines", "by_machine", "floor_db", "DECIDED", "INDICATIVE", "KEEP", "NOTHING"]

#: A configuration measured faster than fp32 with an interval that supports it.
DECIDED = "decided"
#: The fastest measured above fp32, on timings that do not decide it.
INDICATIVE = "indicative"
#: No configuration that met its quality was measured faster than fp32.
KEEP = "keep fp32"
#: Nothing to choose by: the fp32 reference did not run, or nothing else did.
NOTHING = "nothing to choose"

#: Why a configuration whose output is fp32's, bit for bit, is never the choice.
SAME_AS_FP32 = "it computes exactly what fp32 computes here (its output is fp32's, bit for bit)"
#: The table's row key of each main quality metric.
_QUALITY_CELL = {"snr_db": "snr", "psnr_db": "psnr", "sqnr_db": "sqnr"}
_SUFFIXES = ("+compile", "+calibrated")
#: What :func:`~mixprec.bench.runstate.failure` says of a configuration that ran, after "X ran 2.1x but".
_FAILURES = {"non-finite output": "its output was not finite", "output shape differs from fp32's": "its output's shape differs from fp32's",
             "no quality figure": "it has no quality figure against fp32"}
#: What turns an undecided speed-up into a decided one.
_DECIDES = "a longer --budget, a higher --repeat or a quieter machine decides"
#: Other configurations named in one clause; the rest are counted.
_LISTED = 2


@dataclass(frozen=True)
class Headline:
    """The headline of one pipeline at one batch size.

    Attributes:
        pipeline: the run's pipeline.
        batch: the batch size.
        certainty: :data:`DECIDED`, :data:`INDICATIVE`, :data:`KEEP` or :data:`NOTHING`.
        choice: the configuration to use (``fp32`` where nothing beats it; ``None`` where nothing can be chosen).
        speedup: the chosen configuration's paired speed-up against fp32, or ``None``.
        final: whether the run is a final result (:attr:`mixprec.bench.runstate.RunState.final`).
        text: the headline in words, one line.
    """

    pipeline: str
    batch: Any
    certainty: str
    choice: str | None
    speedup: Interval | None
    final: bool
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "batch": self.batch, "certainty": self.certainty, "choice": self.choice,
                "speedup": None if self.speedup is None else self.speedup.to_dict(), "final": self.final, "text": self.text}


def floor_db(name: str) -> float:
    """The quality floor (dB) configuration ``name`` is held to: its preset's (``fast+compile``: fast's), else
    the most permissive preset's."""
    from mixprec.calibration.calibrate import FLOORS_DB  # torch: loaded when a headline is made, not on import

    base = name
    while base.endswith(_SUFFIXES):
        base = next(base[: -len(s)] for s in _SUFFIXES if base.endswith(s))
    if base in FLOORS_DB:
        return float(FLOORS_DB[base])
    return min(float(v) for v in FLOORS_DB.values() if math.isfinite(v))


@dataclass(frozen=True)
class _Candidate:
    name: str
    interval: Interval | None
    unstable: bool
    row: Mapping[str, str]
    out: str | None  # why it did not meet its quality, or None
    fallbacks: int
    floor: float

    @property
    def value(self) -> float:
        return self.interval.value if self.interval is not None and math.isfinite(self.interval.value) else -math.inf

    @property
    def shown(self) -> bool:
        """Whether its speed-up is a figure, as :func:`~mixprec.bench.evidence.speedup_cell` shows one."""
        i = self.interval
        if i is None or self.unstable or not i.usable or i.n == 0 or (i.n is not None and i.n < evidence.MIN_PAIRS):
            return False
        return not i.low <= 1.0 <= i.high

    @property
    def decided(self) -> bool:
        """Whether its speed-up is a figure from a 95% interval (not the range of a few rounds)."""
        return self.shown and self.interval.exact


def _db(value: float) -> str:
    return "exact" if value == math.inf else f"{value:g} dB"


def _quality_out(config: Mapping[str, Any], ref: Mapping[str, Any], row: Mapping[str, str]) -> str | None:
    """Why ``config`` did not meet its quality, or ``None``; ``row``: its table row."""
    why = failure(config, ref)
    if why is not None:
        if config.get("status") != "ok":
            return f"ended with status {why}"
        return _FAILURES.get(why, why)
    quality = main_quality(rundata.metrics(config))
    if quality is None or math.isnan(quality[1]):
        return "it has no quality figure against fp32"
    if quality[1] == math.inf:
        # fp32's output, bit for bit: the same arithmetic, so its speed-up is noise.
        return SAME_AS_FP32
    floor = floor_db(rundata.text(config.get("name")))
    if not quality[1] >= floor:
        key = _QUALITY_CELL.get(quality[0], "")
        shown = row.get(key) or _db(quality[1])
        return f"its {dict(COLUMNS).get(key, quality[0])} {shown} is below its floor of {_db(floor)}"
    return None


def _candidates(run: Mapping[str, Any], batch: Any, ref: Mapping[str, Any], rows: dict[int, Mapping[str, str]]) -> list[_Candidate]:
    out = []
    for config in rundata.group(run, batch):
        if config is ref:
            continue
        name = clip(rundata.text(config.get("name")), limit=60, escape=True)
        metrics, row = rundata.metrics(config), rows[id(config)]
        out.append(_Candidate(name=name, interval=evidence.speedup(run, config), unstable=bool(number(metrics, "unstable")),
                              row=row, out=_quality_out(config, ref, row), fallbacks=int(number(metrics, "fallbacks") or 0),
                              floor=floor_db(rundata.text(config.get("name")))))
    return out


def _rounds(n: int | None) -> str:
    return "no interval" if n == 0 else "rounds not stored" if n is None else f"{n} round{'s' if n != 1 else ''}"


def _sureness(c: _Candidate) -> str:
    """How sure the candidate's speed-up is, in words."""
    i = c.interval
    if i is None:
        return "not timed"
    if c.decided:
        rounds = f" of {i.n} paired rounds" if i.n is not None else ""
        return f"decided: 95% interval{rounds}"
    if c.shown:
        side = "faster" if i.low > 1.0 else "slower"
        return (f"indicative: {_rounds(i.n)}, every one {side} than fp32 "
                f"({evidence.ratio_text(i.low)}–{evidence.ratio_text(i.high)}), too few for a 95% interval")
    if c.unstable:
        return f"indicative: {_rounds(i.n)}, timings too spread to trust"
    if i.n == 0 or not i.usable:
        return "indicative: no interval"
    if i.n is not None and i.n < evidence.MIN_PAIRS:
        return f"indicative: {_rounds(i.n)}, too few to decide"
    return f"indicative: {_rounds(i.n)}, their interval {evidence.ratio_text(i.low)}–{evidence.ratio_text(i.high)} holds 1"


def _figure(c: _Candidate) -> str:
    i = c.interval
    if i is None:
        return "not timed"
    if c.decided:
        return f"{evidence.ratio_text(i.value)}x ({evidence.ratio_text(i.low)}–{evidence.ratio_text(i.high)}) against fp32"
    return f"{evidence.ratio_text(i.value)}x against fp32"


def _quality_cell(row: Mapping[str, str]) -> str | None:
    labels = dict(COLUMNS)
    for key in ("snr", "psnr", "sqnr"):
        if row.get(key, "—") != "—":
            return f"{labels[key]} {row[key]}"
    return None


def _described(c: _Candidate, ref_row: Mapping[str, str]) -> str:
    parts = [f"{_figure(c)}, {_sureness(c)}"]
    if c.row.get("weights", "—") != "—":
        ref_weights = ref_row.get("weights", "—")
        parts.append(f"weights {c.row['weights']}" + (f" (fp32: {ref_weights})" if ref_weights != "—" else ""))
    quality = _quality_cell(c.row)
    if quality is not None:
        parts.append(f"{quality} (floor {_db(c.floor)})")
    if c.row.get("compile", "—") != "—":
        parts.append(f"compiling first took {c.row['compile']}")
    if c.fallbacks:
        parts.append(f"the numerics guard fell back {c.fallbacks} time{'s' if c.fallbacks != 1 else ''}: use it with mixprec.guard")
    return "; ".join(parts)


def _listed(items: list[str]) -> str:
    return few(items, listed=_LISTED)


def _choose(candidates: list[_Candidate], ref_row: Mapping[str, str]) -> tuple[str, _Candidate | None, str]:
    """(certainty, the chosen candidate, the words after the batch)."""
    met = [c for c in candidates if c.out is None and c.interval is not None]
    order = sorted(met, key=lambda c: -c.value)  # stable: the stored order breaks ties
    decided = [c for c in order if c.decided and c.interval.low > 1.0]
    if decided:
        best = decided[0]
        text = f"use {best.name}: {_described(best, ref_row)}"
        close = [c for c in decided[1:] if c.interval.high >= best.interval.low]
        if close:
            text += "; not told apart from " + _listed([f"{c.name} ({evidence.ratio_text(c.value)}x)" for c in close])
        higher = [c for c in order if not c.decided and c.value > best.value]
        if higher:
            text += "; measured faster but only indicative: " + _listed(
                [f"{c.name} ({evidence.ratio_text(c.value)}x, {_sureness(c).removeprefix('indicative: ')})" for c in higher])
        return DECIDED, best, text
    faster = [c for c in order if not c.decided and c.value > 1.0]
    if faster:
        best = faster[0]
        return INDICATIVE, best, (f"maybe {best.name}: {_described(best, ref_row)}; nothing was decided faster than fp32: "
                                  f"{_DECIDES}")
    if not any(c.interval is not None for c in candidates):
        return KEEP, None, "nothing was timed against fp32, so no speed-up decides; keep fp32"
    why = []
    missed = sorted((c for c in candidates if c.out is not None and c.value > 1.0), key=lambda c: -c.value)
    why += [f"{c.name} ran {evidence.ratio_text(c.value)}x but {c.out}" for c in missed[:_LISTED]]
    if len(missed) > _LISTED:
        why.append(f"and {len(missed) - _LISTED} more that fell short")
    undecided = [c.name for c in met if not c.decided]
    if undecided:
        why.append(f"undecided against fp32: {_listed(undecided)}; {_DECIDES}")
    text = "no configuration was measured faster than fp32 here; keep fp32" + (f" ({'; '.join(why)})" if why else "")
    return KEEP, None, text


def headlines(run: Mapping[str, Any]) -> list[Headline]:
    """One :class:`Headline` per batch size of ``run`` (a run dict as the store returns it); one for the
    run where it has no configuration."""
    state = classify(run)
    pipeline = rundata.text(run.get("pipeline"))
    prefix = "" if state.final else f"not a final result ({state.state}){'; so far' if state.state in UNFINISHED else ''}: "
    batches = rundata.batches(run)
    if not batches:
        return [Headline(pipeline, None, NOTHING, None, None, state.final,
                         f"{pipeline}: {prefix}nothing was measured; keep fp32")]
    rows = {id(config): row for config, row in zip(rundata.configs(run), render_table_rows(run))}
    out = []
    for batch in batches:
        head = f"{pipeline}, batch {rundata.text(batch)}: {prefix}"
        ref = evidence.reference(run, batch)
        if ref is None or ref.get("name") != evidence.REFERENCE or failure(ref) is not None:
            out.append(Headline(pipeline, batch, NOTHING, None, None, state.final,
                                f"{head}the fp32 reference did not run, so nothing has a quality or a speed-up to choose by"))
            continue
        candidates = _candidates(run, batch, ref, rows)
        if not candidates:
            out.append(Headline(pipeline, batch, NOTHING, "fp32", None, state.final,
                                f"{head}only fp32 was measured; keep fp32"))
            continue
        certainty, best, words = _choose(candidates, rows[id(ref)])
        out.append(Headline(pipeline, batch, certainty, "fp32" if best is None else best.name,
                            None if best is None else best.interval, state.final, head + words))
    return out


def headline_lines(run: Mapping[str, Any]) -> list[str]:
    """The text of :func:`headlines`, one line per pipeline and batch."""
    return [h.text for h in headlines(run)]


def by_machine(runs: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The :func:`headline_lines` of ``runs`` per machine, in run order: a cluster node's hardware label and host
    (:func:`mixprec.bench.matrix.machine_label`), else the machine's name (``this machine`` where a run names none)."""
    from mixprec.bench.matrix import machine_label

    out: dict[str, list[str]] = {}
    for run in runs:
        machine = run.get("machine") or {}
        name = machine_label(run) if (machine.get("node") or {}).get("label") else rundata.text(machine.get("name"))
        out.setdefault(name or "this machine", []).extend(headline_lines(run))
    return out
