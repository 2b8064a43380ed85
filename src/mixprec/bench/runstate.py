"""What state a stored run is in, said in plain words: the one classification every reader of runs uses.

A run is written as it goes (:class:`~mixprec.bench.store.Store`), so a stored run can be far from a
finished measurement. :func:`classify` reads a run (the dict :meth:`~mixprec.bench.store.Store.load_run`
returns) and names every way in which it falls short, worst first:

- ``runner failed``, ``cancelled``, ``interrupted``, ``unknown status``: the run did not finish (a
  crash of the runner, a Cancel, a Ctrl-C or a process still writing, a status this mixprec does not
  know); its figures are what it measured before it stopped. The rows say it too: a configuration
  still marked ``running`` was not finished by its writer, whatever the run's status;
- ``nothing measured``: it has no configuration, or every configuration failed, timed out or was
  left out;
- ``reference failed``: its fp32 reference did not run at some batch, so nothing of that batch has
  a quality or a speed-up (both are measured against fp32);
- ``no timed rounds``: configurations ran, but none has a timed sample: every speed figure is
  undecided;
- ``partly measured``: some configurations failed, timed out, stopped early or were left out by the
  time budget; the others' figures stand;
- ``older record``: stored by an older mixprec, without the device it was measured on.

Configurations are judged by their stored rows, not by their status alone: one marked ``ok``
whose rows hold no measurement (:func:`unmeasured`: no figure, fewer timed runs than were asked,
timed runs without their latency, a latency without its timed runs) is ``not measured``
(:func:`shown_status`) and counts as failed (:func:`failure`) for every reader.

Only a run whose state is ``complete`` (or an ``older record`` and nothing worse) is a final
result (:attr:`RunState.final`). Only a run that finished, measured its fp32 reference and timed
something can hold another run to anything (:attr:`RunState.usable`): the gate refuses any
other as a baseline. The terminal, ``--json``, CSV, the HTML report and the web UI all say
:attr:`RunState.text`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from mixprec._quote import clip, few
from mixprec.bench import rundata

__all__ = ["RunState", "classify", "failure", "unmeasured", "shown_status", "NOT_MEASURED", "failed_list", "main_quality", "number", "error_line", "with_states", "COMPLETE", "PARTLY", "OLDER", "UNTIMED",
           "NO_REFERENCE", "NOTHING", "INTERRUPTED", "CANCELLED", "CRASHED", "UNKNOWN", "STATES", "REFERENCE"]

#: The configuration every other one in a run is measured against (as :data:`mixprec.bench.evidence.REFERENCE`).
REFERENCE = "fp32"

COMPLETE, PARTLY, OLDER, UNTIMED = "complete", "partly measured", "older record", "no timed rounds"
NO_REFERENCE, NOTHING = "reference failed", "nothing measured"
INTERRUPTED, CANCELLED, CRASHED, UNKNOWN = "interrupted", "cancelled", "runner failed", "unknown status"

#: Every state, worst first: a run's :attr:`RunState.state` is the first of its problems in this order.
STATES: tuple[str, ...] = (CRASHED, UNKNOWN, CANCELLED, INTERRUPTED, NOTHING, NO_REFERENCE, UNTIMED, PARTLY, OLDER,
                           COMPLETE)
#: States in which a run did not finish.
UNFINISHED = frozenset({CRASHED, UNKNOWN, CANCELLED, INTERRUPTED})
#: States whose run cannot hold another run to anything (the gate refuses it as a baseline).
UNUSABLE = UNFINISHED | {NOTHING, NO_REFERENCE, UNTIMED}

#: Failed configurations named in one sentence; the rest are counted.
_LISTED = 5


def error_line(value: Any) -> str:
    """The exception line of a stored error: its traceback stays in the store and the JSON/CSV export."""
    return rundata.text(value).split("\nTraceback (most recent call last):", 1)[0].strip()


def main_quality(metrics: Mapping[str, Any]) -> tuple[str, float] | None:
    """The metric a configuration's quality is judged by (higher is better)."""
    for key in ("snr_db", "psnr_db", "sqnr_db"):
        value = metrics.get(key)
        if value is not None:
            return key, float(value)
    return None


def number(metrics: Mapping[str, Any], name: str) -> float | None:
    """The metric ``name`` as a float, or ``None`` where it is missing or not a number."""
    value = metrics.get(name)
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


#: The status a configuration marked ``ok`` is shown with where its stored rows hold no measurement.
NOT_MEASURED = "not measured"


def unmeasured(config: Mapping[str, Any]) -> str | None:
    """Why a configuration marked ``ok`` holds no measurement in its stored rows, or ``None``: in rows that
    keep what was asked (``repeat_asked``, written since this check exists), fewer timed runs than asked (none included), timed runs without their latency, or a
    latency without the timed runs it comes from. Every reader of runs judges a configuration by this."""
    if config.get("status") != "ok":
        return None
    metrics = rundata.metrics(config)
    samples = config.get("samples") or []
    asked = number(metrics, "repeat_asked")
    left_out = number(metrics, "rounds_left_out") or 0
    if asked is not None and len(samples) + left_out < asked:
        return f"{len(samples)} of {int(asked)} timed runs stored"
    if asked is not None and samples and number(metrics, "latency_median") is None:
        return "timed runs stored without their figures"
    if asked is not None and not samples and number(metrics, "latency_median") is not None:
        return "a latency stored without the timed runs it comes from"
    return None


def shown_status(config: Mapping[str, Any]) -> str:
    """The status a reader shows: the stored one, or :data:`NOT_MEASURED` where :func:`unmeasured` says so."""
    status = rundata.text(config.get("status"))
    return NOT_MEASURED if status == "ok" and unmeasured(config) is not None else status


def failure(config: Mapping[str, Any], ref: Mapping[str, Any] | None = None) -> str | None:
    """Why a configuration counts as failed, or ``None``; ``ref``: its baseline's configuration, if any.

    A status other than ``ok``, a non-finite output, an output of another shape than fp32's, and,
    against a baseline that has a quality figure, no quality figure of its own.
    """
    metrics = rundata.metrics(config)
    if config.get("status") != "ok":
        return rundata.text(config.get("status")) or "no status"
    missing = unmeasured(config)
    if missing is not None:
        return f"{NOT_MEASURED}: {missing}"
    if (number(metrics, "nonfinite") or 0) > 0:
        return "non-finite output"
    if (number(metrics, "shape_mismatch") or 0) > 0:
        return "output shape differs from fp32's"
    old = main_quality(rundata.metrics(ref)) if ref is not None and ref.get("status") == "ok" else None
    if old is not None:
        new = number(metrics, old[0])
        if new is None or math.isnan(new):
            return "no quality figure"
    return None


def _label(config: Mapping[str, Any]) -> str:
    return f"{clip(rundata.text(config.get('name')), limit=40, escape=True)}@{rundata.text(config.get('batch'))}"


def failed_list(configs: list[Mapping[str, Any]]) -> str:
    """``fp32@1 (failed: RuntimeError: boom), fast@1 (timeout)``: the first few, the rest counted;
    an error shows its exception line only."""
    def shown(config: Mapping[str, Any]) -> str:
        error = error_line(config.get("error"))
        return f"{_label(config)} ({failure(config)}{': ' + clip(error, limit=80, escape=True) if error else ''})"

    return few(configs, listed=_LISTED, show=shown)


def _timed(config: Mapping[str, Any]) -> bool:
    return bool(config.get("samples")) or rundata.num(rundata.metrics(config).get("latency_median")) is not None


@dataclass(frozen=True)
class RunState:
    """The state of one stored run.

    Attributes:
        run_id: the run's id.
        problems: ``(state, plain words)`` for every way the run falls short, worst first; empty for a
            complete run.
    """

    run_id: Any
    problems: tuple[tuple[str, str], ...] = ()

    @property
    def state(self) -> str:
        """The worst of its states (:data:`STATES`), or ``complete``."""
        return self.problems[0][0] if self.problems else COMPLETE

    @property
    def states(self) -> tuple[str, ...]:
        return tuple(kind for kind, _ in self.problems)

    @property
    def final(self) -> bool:
        """Whether its figures are a final result: nothing is worse than an older record."""
        return all(kind == OLDER for kind in self.states)

    @property
    def usable(self) -> bool:
        """Whether it can hold another run to anything: it finished, its fp32 reference ran, it timed something."""
        return not set(self.states) & UNUSABLE

    @property
    def text(self) -> str:
        """``complete``, or the states and why: ``nothing measured: every configuration failed (...)``."""
        if not self.problems:
            return COMPLETE
        return "; ".join(f"{kind}: {why}" for kind, why in self.problems)

    @property
    def warning(self) -> str | None:
        """What a reader says beside the run's figures, or ``None`` for a final result."""
        if self.final:
            return None
        return f"run {self.run_id} is not a final result: {self.text}"

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "final": self.final, "usable": self.usable,
                "problems": [{"state": kind, "reason": why} for kind, why in self.problems]}


def classify(run: Mapping[str, Any]) -> RunState:
    """The state of ``run`` (a run dict as the store returns it): every problem, worst first."""
    found: dict[str, str] = {}
    status = run.get("status")
    if status == "failed":
        found[CRASHED] = "the benchmark runner itself failed; its notes say how"
    elif status == "cancelled":
        found[CANCELLED] = "stopped by a Cancel before the end; it shows what was measured until then"
    elif status == "incomplete":
        found[INTERRUPTED] = ("it never finished (interrupted, or still being written by a running benchmark); "
                              "it shows what was measured until then")
    elif status not in ("complete", None):  # a run dict made without a status is read as complete
        found[UNKNOWN] = (f"its status {clip(rundata.text(status), limit=40, escape=True)!r} is not one this mixprec "
                          "writes (complete, incomplete, cancelled, failed)")
    configs = rundata.configs(run)
    # The rows themselves: a configuration still marked running has not been finished by its writer.
    running = [c for c in configs if c.get("status") == "running"]
    if running and status in ("incomplete", "complete", None):
        found[INTERRUPTED] = (f"{few(running, show=_label)} still marked running: a benchmark is still writing it, or its "
                              "process ended before finishing them; it shows what was measured until then")
    ran = [c for c in configs if failure(c) is None]
    if not configs:
        found[NOTHING] = "it has no configuration"
    elif not ran:
        found[NOTHING] = f"every configuration failed ({failed_list(configs)})"
    else:
        lacking = [b for b in rundata.batches(run)
                   if not any(c.get("name") == REFERENCE and failure(c) is None for c in rundata.group(run, b))]
        if lacking:
            found[NO_REFERENCE] = (f"its {REFERENCE} reference did not run at batch {', '.join(map(str, lacking))}, so "
                                   "nothing there has a quality or a speed-up (both are measured against it)")
        if not any(_timed(c) for c in ran):
            found[UNTIMED] = ("no configuration has a timed run: every speed figure is undecided "
                              "(re-run with --repeat of 3 or more)")
        not_ran = [c for c in configs if failure(c) is not None]
        if not_ran:
            found[PARTLY] = (f"{len(not_ran)} of {len(configs)} configurations did not run to the end "
                             f"({failed_list(not_ran)}); the others' figures stand")
    machine = run.get("machine") or {}
    if not machine.get("device"):
        found[OLDER] = ("stored by an older mixprec, without the device it was measured on"
                        + (f" (read from its probed hardware: {rundata.text(machine['device_type'])})"
                           if machine.get("device_type") else ""))
    return RunState(run.get("id", "?"), tuple((kind, found[kind]) for kind in STATES if kind in found))


def with_states(rows: Iterable[dict[str, Any]], load: Any) -> list[dict[str, Any]]:
    """Rows of :meth:`~mixprec.bench.store.Store.runs` with each run's ``state`` and ``final`` (read through
    ``load(run_id)``, such as ``store.load_run``) and the reason (``state_text``)."""
    out = []
    for row in rows:
        state = classify(load(row["id"]))
        out.append({**row, "state": state.state, "final": state.final, "state_text": state.text})
    return out
