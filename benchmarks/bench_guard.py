"""Overhead of the numerics guard in ``components`` mode, on the reference pipelines.

For each pipeline (batch 1, fast preset) the same applied model runs with and without
``mixprec.guard(applied)`` in interleaved A-B-B-A rounds; the ratio of medians is the
end-to-end added latency (noisy on a shared machine). The time spent inside the
guard's own hook work (the finiteness reductions and input capture) is also summed
directly, which measures the overhead itself rather than the machine's noise.
Budget: at most 3%.

Usage:
    HF_HUB_OFFLINE=1 python benchmarks/bench_guard.py [--size default] [--repeat 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from _report import finish

import mixprec
import mixprec.diagnose.guard as guard_module
from mixprec import hardware, pipelines
from mixprec.diagnose.fallbacks import FallbackStore


class _Timed:
    """Wrap a function of mixprec.guard and add up the time spent in it."""

    def __init__(self, name: str):
        self.name, self.original, self.total = name, getattr(guard_module, name), 0.0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.original(*args, **kwargs)
        finally:
            self.total += time.perf_counter() - start


def bench(name: str, size: str, repeat: int, store: FallbackStore) -> tuple[float, float, float]:
    pipe = pipelines.get(name, size=size, seed=0)
    inputs = pipe.example_inputs(1, 0)
    applied = mixprec.apply(pipe, mixprec.preset("fast", hints=tuple(pipe.sensitive)))
    guard = mixprec.guard(applied, store=store, remember=False)
    guard.remove()
    timers = [_Timed("all_finite"), _Timed("_rewind_points")]
    times: dict[str, list[float]] = {"plain": [], "guarded": []}
    in_hooks = 0.0
    for round_index in range(repeat + 1):
        for mode in (("plain", "guarded") if round_index % 2 else ("guarded", "plain")):
            if mode == "guarded":
                guard._install()
                for t in timers:
                    t.total = 0.0
                    setattr(guard_module, t.name, t)
            start = time.perf_counter()
            pipe.run(inputs)
            elapsed = time.perf_counter() - start
            if mode == "guarded":
                guard.remove()
                for t in timers:
                    setattr(guard_module, t.name, t.original)
                if round_index:
                    in_hooks += sum(t.total for t in timers)
            if round_index:
                times[mode].append(elapsed)
    applied.revert()
    plain = statistics.median(times["plain"])
    return plain, statistics.median(times["guarded"]), in_hooks / repeat / plain


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", default="tts,diffusion,minilm")
    parser.add_argument("--size", default="default")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    hw = hardware.probe()
    store = FallbackStore(Path("/tmp") / "mixprec-bench-fallbacks.json")
    lines = [
        f"$ HF_HUB_OFFLINE=1 python benchmarks/bench_guard.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip(),
        "",
        f"device: {hw.device_type} ({hw.name}), {hw.threads} threads, torch {torch.__version__}; fast preset, batch 1, "
        f"size={args.size}, {args.repeat} interleaved rounds after one warm-up",
        "",
        "| pipeline | without guard (s) | with guard (s) | end-to-end ratio | time in guard work |",
        "|---|---|---|---|---|",
    ]
    for name in args.pipelines.split(","):
        repeat = args.repeat * (40 if name.strip() == "minilm" else 1)  # 9 ms runs: many more rounds
        plain, guarded, share = bench(name.strip(), args.size, repeat, store)
        lines.append(f"| {name} | {plain:.4f} | {guarded:.4f} | {100 * (guarded / plain - 1):+.2f}% | {100 * share:.2f}% |")
        print(lines[-1], flush=True)
    return finish(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
