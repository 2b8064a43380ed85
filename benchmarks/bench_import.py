"""How long ``import mixprec`` takes in a fresh interpreter, for one source tree or several
compared side by side.

Each round imports every tree once, in turn (interleaved, so a busy moment of a shared
machine hits them all), in a new interpreter with ``-X importtime``. Reported per tree:
the median wall time of the whole interpreter, the median cumulative import time of
``mixprec`` (from ``-X importtime``, the figure the layout must not worsen) and, against
the first tree, the ratio of the medians with its spread over rounds (min-max of the
per-round ratios).

Example (the current tree against a checkout of an earlier commit)::

    git worktree add /tmp/before HEAD~5
    .venv/bin/python benchmarks/bench_import.py --tree /tmp/before/src --tree src --rounds 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import finish  # noqa: E402


def import_once(tree: str) -> tuple[float, float]:
    """(wall seconds of the interpreter, cumulative seconds ``import mixprec`` took inside it)."""
    env = dict(os.environ, PYTHONPATH=tree)
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import mixprec"], env=env, capture_output=True,
                         text=True, check=True)
    wall = time.perf_counter() - start
    # "import time: self [us] | cumulative | imported package"; the top-level line for mixprec
    cumulative = next(int(line.split("|")[1]) for line in reversed(out.stderr.splitlines())
                      if line.rstrip().endswith("| mixprec"))
    return wall, cumulative / 1e6


def cpu_flags() -> str:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "unknown"
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")
    return " ".join(f for f in wanted if f in flags) or "none of " + "/".join(wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", help="a directory holding the mixprec package (repeatable; "
                                                        "default: this checkout's src)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    trees = [str(Path(t).resolve()) for t in (args.tree or [Path(__file__).resolve().parents[1] / "src"])]
    for tree in trees:
        import_once(tree)  # warm the file cache and __pycache__ of every tree
    samples: dict[str, list[tuple[float, float]]] = {t: [] for t in trees}
    for _ in range(args.rounds):
        for tree in trees:
            samples[tree].append(import_once(tree))
    base = samples[trees[0]]
    lines = [f"`{' '.join(['python', 'benchmarks/bench_import.py', *sys.argv[1:]])}`", "",
             f"CPU flags: {cpu_flags()}; {os.cpu_count()} threads; Python {sys.version.split()[0]}; {args.rounds} rounds", "",
             "| tree | interpreter wall, median | `import mixprec` cumulative, median | vs first tree (min-max per round) |",
             "|---|---|---|---|"]
    for tree in trees:
        walls, imports = [s[0] for s in samples[tree]], [s[1] for s in samples[tree]]
        ratios = [s[1] / b[1] for s, b in zip(samples[tree], base)]
        lines.append(f"| `{tree}` | {statistics.median(walls) * 1e3:.0f} ms | {statistics.median(imports) * 1e3:.0f} ms | "
                     f"{statistics.median(imports) / statistics.median([b[1] for b in base]):.3f}x "
                     f"({min(ratios):.2f}-{max(ratios):.2f}) |")
    return finish(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
