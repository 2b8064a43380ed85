"""Profile the reference pipelines at batch 1 and report where CPU time goes.

For every pipeline: build it, run once to warm up, time one run (wall clock),
then run once more under ``torch.profiler`` and report the share of self CPU
time spent in dense kernels (matmul, linear, convolution, attention, RNN) and
the ten most expensive operators.

Usage::

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/profile_pipelines.py [--size default]
        [--batch 1] [names...]
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from mixprec import pipelines

_DENSE_EXACT = {
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot",
    "_addmm_activation", "lstm", "mkldnn_rnn", "mkldnn_rnn_layer", "_thnn_fused_lstm_cell",
}
_DENSE_PREFIXES = (
    "conv", "_convolution", "mkldnn_convolution", "slow_conv", "_slow_conv", "_nnpack",
    "scaled_dot_product", "_scaled_dot_product", "_flash_attention", "_efficient_attention",
    "mkldnn_linear", "_mkldnn_",
)


def is_dense(op_name: str) -> bool:
    """Whether a profiler op name is a dense matmul/convolution/attention/RNN kernel."""
    short = op_name.split("::", 1)[-1]
    return short in _DENSE_EXACT or short.startswith(_DENSE_PREFIXES)


def profile_one(
    name: str, *, size: str, seed: int, batch: int = 1
) -> tuple[str, float, float]:
    """Profile pipeline ``name``; return its report, wall time per run and dense share.

    Pipelines faster than a second are run repeatedly (up to 20 times) so the
    wall time (median) and the profile are not dominated by timer noise.
    """
    start = time.perf_counter()
    pipe = pipelines.get(name, size=size, seed=seed)
    build_s = time.perf_counter() - start
    inputs = pipe.example_inputs(batch, seed)
    start = time.perf_counter()
    pipe.run(inputs)  # warm-up: allocator, oneDNN primitive caches
    repeats = max(1, min(20, math.ceil(1.0 / max(time.perf_counter() - start, 1e-3))))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        pipe.run(inputs)
        times.append(time.perf_counter() - start)
    wall_s = statistics.median(times)

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            pipe.run(inputs)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total_us = sum(e.self_cpu_time_total for e in events)
    dense_us = sum(e.self_cpu_time_total for e in events if is_dense(e.key))
    fraction = dense_us / total_us if total_us else 0.0

    lines = [f"== {name} (size={size}, batch={batch}, seed={seed})"]
    lines.append(
        f"build: {build_s:.2f} s   wall time per run: {wall_s:.3f} s   "
        f"(median of {repeats}; profile covers {repeats} run(s))"
    )
    counts = pipe.parameter_counts()
    for component, count in counts.items():
        lines.append(f"  params {component:<14} {count:>13,}")
    lines.append(
        f"dense-kernel share of self CPU time: {fraction:.1%} "
        f"({dense_us / 1e6:.3f} s of {total_us / 1e6:.3f} s profiled)"
    )
    lines.append("top 10 ops by self CPU time:")
    for event in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]:
        share = event.self_cpu_time_total / total_us
        mark = "dense" if is_dense(event.key) else ""
        lines.append(
            f"  {event.key:<48} {event.self_cpu_time_total / 1e3:>10.1f} ms "
            f"{share:>6.1%} calls={event.count:<7} {mark}"
        )
    return "\n".join(lines), wall_s, fraction


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="pipelines to profile (default: all)")
    parser.add_argument("--size", default="default", help="pipeline size (default: default)")
    parser.add_argument("--seed", type=int, default=0, help="weights and inputs seed")
    parser.add_argument("--batch", type=int, default=1, help="batch size (default: 1)")
    args = parser.parse_args(argv)
    names = args.names or pipelines.available()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"python {platform.python_version()}, {platform.processor() or platform.machine()}"
    )
    summary = []
    for name in names:
        report, wall_s, fraction = profile_one(
            name, size=args.size, seed=args.seed, batch=args.batch
        )
        print(report, flush=True)
        print()
        summary.append(f"  {name:<10} {wall_s:>8.3f} s   dense {fraction:6.1%}")
    print(f"summary (size={args.size}, batch={args.batch}: wall time per run, dense-kernel share)")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
