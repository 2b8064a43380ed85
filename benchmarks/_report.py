"""What every benchmark script does last: write its markdown table and print it; how its
speed-up cells read (as in every table of mixprec: a figure only where its interval supports one)
and its quality figures; and the flags of the scripts that run the reference pipelines whole."""

from __future__ import annotations

import argparse
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


def db_text(value: float) -> str:
    """An SQNR/SNR figure: ``exact`` for an identical output, else ``24.5 dB``."""
    return "exact" if value == float("inf") else f"{value:.1f} dB"


def pipeline_parser(description: str) -> argparse.ArgumentParser:
    """The flags of a script that runs reference pipelines whole, on a device, in paired rounds:
    ``--pipelines``, ``--size``, ``--device`` (CUDA where there is one), ``--rounds``, ``--out``."""
    import torch

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--pipelines", default="tts,diffusion")
    parser.add_argument("--size", default="default")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    return parser


def finish(lines: list[str], out: str | None) -> int:
    """Join ``lines``, write them to ``out`` (if given), print them; the script's exit status."""
    text = "\n".join(lines) + "\n"
    if out:
        Path(out).write_text(text)
    print(text)
    return 0
