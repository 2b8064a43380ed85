"""The 16-bit FLOP report of a test session and the budget it is held to (pure functions).

The budget file (``tests/flops16_budget.json``) holds:

* ``per_test_flops``: the most one test may compute in bf16 and fp16 together;
* ``total_flops``: the most the whole session may;
* ``unbudgeted_markers``: marker name -> why the tests carrying it are reported but left out
  of both (a test that measures the machine it runs on computes what that machine's speed
  decides, so its count is not the same on every machine).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["NAMES", "Budget", "flops", "gflop", "load_budget", "over_budget", "over_ceiling", "summarize"]

#: What is counted per test, as the report names it: FLOPs per dtype, reference pipelines built
#: (``mixprec.pipelines.get``), Python processes started.
NAMES = ("bf16", "fp16", "fp32", "builds", "processes")
#: The 16-bit dtypes, held to the per-test ceiling and ``total_flops``.
SIXTEEN = ("bf16", "fp16")
#: The other counts, each held to a total of its own (``totals`` in the budget file).
OTHERS = ("fp32", "builds", "processes")


class Budget(dict):
    """``{"per_test_flops": int, "total_flops": int, "totals": {"fp32"|"builds"|"processes": int},
    "unbudgeted_markers": {name: why}}``."""


def load_budget(path: str | Path) -> Budget:
    """The budget in the JSON file at ``path``.

    Raises:
        ValueError: the file cannot be read, or lacks ``per_test_flops`` or ``total_flops``;
            the message names the file and what it must hold.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        totals = {name: int(value) for name, value in dict(data.get("totals", {})).items()}
        unknown = sorted(set(totals) - set(OTHERS))
        if unknown:
            raise ValueError(f"totals names {', '.join(unknown)}; it may hold {', '.join(OTHERS)}")
        budget = Budget(per_test_flops=int(data["per_test_flops"]), total_flops=int(data["total_flops"]), totals=totals,
                        unbudgeted_markers=dict(data.get("unbudgeted_markers", {})))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a budget file: it must be JSON with the integers per_test_flops and total_flops "
                         f"(and optionally totals, {' / '.join(OTHERS)} -> integer, and unbudgeted_markers, marker -> reason) "
                         f"({type(exc).__name__}: {exc})") from None
    return budget


def flops(counts: dict[str, Any]) -> int:
    """bf16 and fp16 FLOPs together."""
    return sum(int(counts.get(name, 0)) for name in SIXTEEN)


def gflop(count: float) -> str:
    return f"{count / 1e9:,.2f} GFLOP"


def summarize(tests: dict[str, dict[str, Any]], by_op: dict[str, int], uncounted: dict[str, int]) -> dict[str, Any]:
    """The report: every test's counts; ``total``: each count over all tests, ``all`` the 16-bit FLOPs,
    ``budgeted`` the 16-bit FLOPs of the tests without an unbudgeted marker and ``budgeted_others``
    their other counts; ``by_op``: FLOPs per operator in the tests' processes."""
    total = {name: sum(int(t.get(name, 0)) for t in tests.values()) for name in NAMES}
    kept = [t for t in tests.values() if "unbudgeted" not in t]
    budgeted = sum(flops(t) for t in kept)
    others = {name: sum(int(t.get(name, 0)) for t in kept) for name in OTHERS}
    return {"unit": "FLOP", "total": {**total, "all": flops(total), "budgeted": budgeted, "budgeted_others": others},
            "tests": tests, "by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1])), "uncounted": uncounted}


#: How each count reads in a message.
_UNITS = {"fp32": gflop, "builds": lambda n: f"{n:,} pipeline builds", "processes": lambda n: f"{n:,} processes started"}


def over_budget(report: dict[str, Any], budget: Budget, where: str) -> str | None:
    """Why ``report`` exceeds ``budget`` in total (``where``: the budget file), or ``None``."""
    budgeted = [(nodeid, t) for nodeid, t in report["tests"].items() if "unbudgeted" not in t]
    reasons = []
    total = report["total"]["budgeted"]
    if total > budget["total_flops"]:
        top = sorted(budgeted, key=lambda kv: -flops(kv[1]))[:5]
        largest = "; ".join(f"{nodeid}: {gflop(flops(t))}" for nodeid, t in top)
        reasons.append(f"the suite computed {gflop(total)} in bf16/fp16, above the budget of {gflop(budget['total_flops'])} "
                       f"(total_flops in {where}); the largest: {largest}")
    for name, ceiling in budget.get("totals", {}).items():
        used = report["total"]["budgeted_others"][name]
        if used <= ceiling:
            continue
        unit = _UNITS[name]
        top = sorted(budgeted, key=lambda kv: -int(kv[1].get(name, 0)))[:5]
        largest = "; ".join(f"{nodeid}: {unit(int(t.get(name, 0)))}" for nodeid, t in top)
        label = "fp32 FLOPs" if name == "fp32" else name
        reasons.append(f"the suite's {label}: {unit(used)}, above the budget of {unit(ceiling)} (totals.{name} in {where}); "
                       f"the largest: {largest}")
    return " | ".join(reasons) or None


def over_ceiling(nodeid: str, counts: dict[str, int], budget: Budget, where: str) -> str | None:
    """Why one test's ``counts`` exceed the per-test ceiling, or ``None``."""
    if flops(counts) <= budget["per_test_flops"]:
        return None
    return (f"{nodeid} computed {gflop(flops(counts))} in 16-bit (bf16 {gflop(counts['bf16'])}, fp16 "
            f"{gflop(counts['fp16'])}), above the per-test ceiling of {gflop(budget['per_test_flops'])} (per_test_flops "
            f"in {where}): shrink the sizes it computes in bf16/fp16 (a test of a 16-bit code path rarely needs more "
            "than a few layers of width 64)")
