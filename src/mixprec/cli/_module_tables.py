"""How ``explain`` and ``diagnose`` print a pipeline's modules: a summary first, repeated
blocks collapsed to one row, and the columns a narrow terminal leaves out chosen by weight."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Iterable, Sequence

from mixprec.cli._text import line

__all__ = ["EXPLAIN_COLUMNS", "EXPLAIN_DROP", "PROFILE_COLUMNS", "PROFILE_DROP", "collapse", "explain_rows",
           "explain_summary", "profile_rows"]

EXPLAIN_COLUMNS = ["module", "type", "storage", "compute", "attention", "rule"]
#: Left out first where the terminal is narrow.
EXPLAIN_DROP = ("attention", "type", "storage")
PROFILE_COLUMNS = ["module", "type", "compute", "calls", "absmax in/out", "fp16 room", "underflow 16/bf", "own dB",
                   "inher. dB"]
PROFILE_DROP = ("calls", "underflow 16/bf", "compute", "inher. dB", "fp16 room", "type")

_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")


def collapse(rows: Sequence[dict[str, Any]], fields: Sequence[str]) -> list[tuple[str, dict[str, Any], int]]:
    """``(name, row, count)`` per group of rows whose module names differ only in block indexes
    (``layers.0.mlp``, ``layers.1.mlp``) and whose ``fields`` are all equal; the group is named
    with ``*`` for the index (``layers.*.mlp``, as policy rules match) and keeps its first row's place."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        key = (_INDEX.sub("*", str(row["module"])), *(str(row.get(f)) for f in fields))
        groups.setdefault(key, []).append(row)
    out = []
    for key, members in groups.items():
        name = key[0] if len(members) > 1 else str(members[0]["module"])
        out.append((name, members[0], len(members)))
    return out


def explain_summary(title: str, rows: Sequence[dict[str, Any]], *, warnings: int, advice: int,
                    collapsed: int | None) -> list[str]:
    """A few lines before ``explain``'s table: components, dtypes, fp32 islands, what follows."""
    components = Counter(str(r["module"]).split(".", 1)[0] for r in rows)
    storage = Counter(str(r["storage"]) for r in rows)
    compute = Counter(str(r["compute"]) for r in rows)
    lines = [f"{title}: {len(rows)} modules in {len(components)} components ("
             + ", ".join(f"{name} {n}" for name, n in components.items()) + ")",
             "  storage: " + _counts(storage) + "; compute: " + _counts(compute)]
    main = compute.most_common(1)[0][0] if compute else None
    if main not in (None, "fp32") and compute.get("fp32"):
        rules = Counter(str(r["rule"]) for r in rows if r["compute"] == "fp32")
        lines.append(f"  fp32 islands: {compute['fp32']} modules computed in fp32 among {main} ones, by "
                     + ", ".join(rule for rule, _ in rules.most_common(3)) + (", ..." if len(rules) > 3 else ""))
    after = [f"{n} {word}{'s' if n != 1 and word == 'warning' else ''}" for n, word in ((warnings, "warning"), (advice, "advice")) if n]
    if collapsed is not None:
        lines.append(f"  repeated blocks are one row each ({collapsed} rows for {len(rows)} modules; --expand lists every module)")
    if after:
        lines.append(f"  {' and '.join(after)} after the table")
    return lines


def _counts(counter: Counter) -> str:
    return ", ".join(f"{name} {n}" for name, n in counter.most_common())


def explain_rows(rows: Sequence[dict[str, Any]], *, expand: bool) -> list[list[Any]]:
    """The table rows of ``explain``: one per module, or per group of repeated blocks (``×N``)."""
    if expand:
        return [[r["module"], r["type"], r["storage"], r["compute"], r["attention"] or None, r["rule"]] for r in rows]
    out = []
    for name, r, count in collapse(rows, EXPLAIN_COLUMNS[1:]):
        out.append([f"{name} ×{count}" if count > 1 else name, r["type"], r["storage"], r["compute"], r["attention"] or None,
                    r["rule"]])
    return out


def profile_rows(stats: Iterable[Any]) -> list[list[Any]]:
    """``diagnose``'s table rows from profile statistics (:class:`mixprec.diagnose.profile_result.ModuleStats`)."""
    def db(v: float | None) -> str | None:
        return None if v is None else f"{v:.1f}"

    return [[line((f"{s.module} (fp16 overflow)", "bold red")) if s.overflows_fp16 else s.module,
             s.type if s.owns_weights else f"{s.type} (block)", s.compute, s.calls,
             f"{s.input_absmax:.3g}/{s.output_absmax:.3g}", f"{s.fp16_headroom:.2g}",
             f"{s.underflow_fp16:.1%}/{s.underflow_bf16:.1%}", db(s.own_sqnr_db), db(s.inherited_sqnr_db)] for s in stats]
