"""What every benchmark script does last: write its markdown table and print it; and how its
speed-up cells read (as in every table of mixprec: a figure only where its interval supports one)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from mixprec.bench.evidence import Interval, speedup_cell
from mixprec.measure.stats import paired_ratio


def speedup(reference: Sequence[float], candidate: Sequence[float]) -> str:
    """The speed of ``candidate`` against ``reference`` from seconds timed in the same rounds
    (paired by position), as :func:`mixprec.bench.evidence.speedup_cell` shows it:
    ``1.42x (1.31–1.55)``, ``undecided (0.90–1.07)`` or ``undecided (n=2)``."""
    r = paired_ratio(list(reference), list(candidate))
    return speedup_cell(Interval(r.value, r.low, r.high, r.n, r.exact))


def finish(lines: list[str], out: str | None) -> int:
    """Join ``lines``, write them to ``out`` (if given), print them; the script's exit status."""
    text = "\n".join(lines) + "\n"
    if out:
        Path(out).write_text(text)
    print(text)
    return 0
