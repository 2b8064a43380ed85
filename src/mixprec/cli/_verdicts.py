"""How ``mixprec compare`` and ``mixprec gate`` print what the intervals support.

Every figure printed here comes from the same row as the verdict beside it, so a
ratio never says more than its interval: a change is called only where the intervals
do not overlap, and where they cannot tell the table says "undecided on this machine".
"""

from __future__ import annotations

import json
import math
from typing import Any

from rich.console import Console

from mixprec._json import strict
from mixprec._quote import few
from mixprec.cli._common import table
from mixprec.cli._text import say

__all__ = ["print_compare", "print_gate", "rows_json"]

_COLUMNS = ["config", "batch", "latency A", "latency B", "change", "latency", "speed-up vs fp32 A",
            "speed-up vs fp32 B", "beyond noise", "quality A", "quality B"]


def _seconds(value: float | None) -> str | None:
    return None if value is None else f"{value:.4f} s"


def _quality(value: float | None) -> str | None:
    if value is None:
        return None
    if math.isnan(value):
        return "nan"
    return "exact" if value == math.inf else f"{value:.1f} dB"


def _speedup(value: dict[str, Any] | None, unstable: Any = False) -> str | None:
    from mixprec.bench.evidence import Interval, speedup_cell  # numpy and torch load with the benchmark, not the CLI

    if value is None:
        return None
    interval = Interval(value["value"], value["low"], value["high"], value.get("n"), bool(value.get("exact", True)))
    return speedup_cell(interval, unstable=bool(unstable))


def _change(row: dict[str, Any]) -> str | None:
    change = row.get("latency_change")
    return None if change is None else f"{change:+.1%}"


def _beyond(row: dict[str, Any]) -> str | None:
    verdict = row.get("speedup_verdict")
    if verdict in ("faster", "slower"):
        return f"yes: {verdict} ({row['speedup_change']:+.1%})"
    return verdict


def rows_json(rows: list[dict[str, Any]]) -> str:
    """``compare``'s rows as strict JSON: infinities and NaN as ``"inf"``, ``"-inf"``, ``"nan"``, as the exports write them."""
    return json.dumps(strict(rows), allow_nan=False, default=str)


def print_compare(console: Console, run_a: int, run_b: int, rows: list[dict[str, Any]],
                  states: tuple[Any, Any] | None = None) -> None:
    """The table of :func:`mixprec.bench.gate.compare`, with what its verdicts rest on; ``states``: the two
    runs' :class:`~mixprec.bench.runstate.RunState`, said above the table where either is not a final result."""
    for state in states or ():
        if state.warning is not None:
            say(console, ("not a final result: ", "bold yellow"), f"run {state.run_id}: {state.text}", soft_wrap=False)
    console.print(table(f"run {run_a} -> run {run_b}", _COLUMNS, [
        [r["config"], r["batch"], _seconds(r.get("latency_a")), _seconds(r.get("latency_b")), _change(r),
         r.get("latency_verdict"), _speedup(r.get("speedup_a"), r.get("unstable_a")), _speedup(r.get("speedup_b"), r.get("unstable_b")), _beyond(r),
         _quality(r.get("quality_a")), _quality(r.get("quality_b"))] for r in rows],
        drop=("latency A", "latency B", "batch", "quality A", "change", "latency", "speed-up vs fp32 A")))
    say(console, "  beyond noise: each configuration's speed-up against its own run's fp32 (paired rounds, 95% "
                 "intervals) differs between the runs only where the intervals do not overlap. Latencies are "
                 "absolute times taken at different moments: the machine's load moves them, fp32's included.", soft_wrap=False)
    devices = next(((r["device_a"], r["device_b"]) for r in rows if "device_a" in r), None)
    if devices is not None:
        say(console, f"  different devices: run {run_a} was measured on {devices[0]}, run {run_b} on {devices[1]}; they are "
                     "never compared as one machine, even on one host. Their latencies time two devices, not a change, "
                     "and are not judged: only each configuration's speed-up against its own run's fp32 compares.", soft_wrap=False)
    for side, run in (("a", run_a), ("b", run_b)):
        unstable = [f"{r['config']}@{r['batch']}" for r in rows if r.get(f"unstable_{side}")]
        if unstable:
            say(console, f"  unstable timings in run {run} (see its notes): ", few(unstable), soft_wrap=False)
    for side, run in (("a", run_a), ("b", run_b)):
        lacking = [r for r in rows if r.get(f"not_measured_{side}")]
        if lacking:
            say(console, f"  not measured in run {run} (marked ok, but its stored rows hold no measurement): ",
                few(lacking, show=lambda r: f"{r['config']}@{r['batch']} ({r[f'not_measured_{side}']})"), soft_wrap=False)
    undecided = [f"{r['config']}@{r['batch']}" for r in rows
                 if "undecided on this machine" in (r.get("speedup_verdict"), r.get("latency_verdict"))]
    if undecided:
        say(console, "  undecided on this machine: ", few(undecided),
            ": the intervals are too wide to tell; re-run both with more --repeat, or on a quieter machine", soft_wrap=False)


def print_gate(console: Console, run_id: int, baseline: int, result: Any, *, fail_undecided: bool) -> None:
    """The gate's verdict, its violations, and the checks the measurements could not decide."""
    if result.unusable:
        say(console, ("error:", "bold red"), f" gate cannot decide: run {run_id} vs baseline {baseline} "
                     "(nothing was checked against it):")
        for reason in result.unusable:
            say(console, "  - ", reason)
        if result.violations:
            say(console, "  and the run itself fails:")
            for violation in result.violations:
                say(console, "  - ", violation)
        return
    if result.violations:
        say(console, f"gate FAILED: run {run_id} vs baseline {baseline}")
        for violation in result.violations:
            say(console, "  - ", violation)
    else:
        say(console, f"gate passed: run {run_id} vs baseline {baseline}")
    if result.undecided and not fail_undecided:
        say(console, "  undecided on this machine (these pass; --fail-undecided makes them fail):")
        for item in result.undecided:
            say(console, "  ? ", item)
    for note in result.notes:
        say(console, "  note: ", note)
