"""Overhead of the per-layer input casts (``LeafCast``) on the reference pipelines.

Every module that owns weights gets a pre-hook that casts what reaches it to the dtype
it computes in, so inputs made inside a parent's forward or carried in dataclasses
work. When the dtype already matches, the hook returns without allocating; this
measures what that fast path costs where it matters most: when compute is fast.

The policy stores every weight in fp32 except the first layer of each component (bf16
storage, fp32 compute), which makes every component mixed, so every other weight-owning
module gets a leaf cast whose fast path runs at full fp32 speed. The same applied model then runs
with the leaf-cast wrappers and with exactly those removed (all other hooks kept),
in interleaved A-B-B-A rounds; the ratio of medians is the overhead. The hook calls
are counted too (leaf-cast checks per pipeline run).

Usage:
    HF_HUB_OFFLINE=1 python benchmarks/bench_leaf_casts.py [--size default] [--repeat 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from _report import finish

import mixprec
from mixprec import hardware, pipelines
from mixprec.casting.hooks import LeafCast
from mixprec.policy import Policy, Rule


def _first_layers(pipe) -> list[str]:
    """The first Linear (or convolution) of each component: marking it makes the component mixed."""
    names = []
    for cname, root in pipe.components.items():
        for name, module in root.named_modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d)):
                names.append(f"{cname}.{name}")
                break
    return names


def bench(name: str, size: str, repeat: int) -> tuple[float, float, int, int]:
    pipe = pipelines.get(name, size=size, seed=0)
    inputs = pipe.example_inputs(1, 0)
    marks = tuple(Rule(name, storage="bf16", compute="fp32") for name in _first_layers(pipe))
    policy = Policy((Rule("*", storage="fp32"), *marks), name="mixed-fp32")
    applied = mixprec.apply(pipe, policy)
    leaf = [h for h in applied._handles if isinstance(h, LeafCast)]
    times: dict[str, list[float]] = {"without": [], "with": []}
    for round_index in range(repeat + 1):
        for mode in (("without", "with") if round_index % 2 else ("with", "without")):
            for cast in leaf:
                cast.remove() if mode == "without" else cast.install(cast.module)
            start = time.perf_counter()
            pipe.run(inputs)
            elapsed = time.perf_counter() - start
            if round_index:
                times[mode].append(elapsed)
    # One counted run: how many leaf-cast checks a pipeline run makes.
    calls = 0
    for cast in leaf:
        cast.remove()
        original = cast.compute

        def counted(original=original):
            nonlocal calls
            calls += 1
            return original()

        cast.compute = counted
        cast.install(cast.module)
    pipe.run(inputs)
    applied.revert()
    return statistics.median(times["without"]), statistics.median(times["with"]), len(leaf), calls


def per_call_cost(rounds: int = 7, calls: int = 2000) -> float:
    """Seconds one leaf-cast check adds to a call whose input already has the right dtype.

    A small Linear is called with and without the wrapper, interleaved; the fastest
    round of each is kept, so a busy machine does not inflate the difference.
    """
    layer = torch.nn.Linear(8, 8)
    x = torch.randn(1, 8)
    cast = LeafCast(lambda: layer.weight.dtype, 0)
    best = {"with": float("inf"), "without": float("inf")}
    with torch.no_grad():
        for _ in range(rounds):
            for mode in ("with", "without"):
                cast.install(layer) if mode == "with" else None
                start = time.perf_counter()
                for _ in range(calls):
                    layer(x)
                best[mode] = min(best[mode], (time.perf_counter() - start) / calls)
                cast.remove() if mode == "with" else None
    return max(0.0, best["with"] - best["without"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", default="tts,diffusion,minilm")
    parser.add_argument("--size", default="default")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    hw = hardware.probe()
    lines = [
        f"$ HF_HUB_OFFLINE=1 python benchmarks/bench_leaf_casts.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip(),
        "",
        f"device: {hw.device_type} ({hw.name}; CPU flags: {', '.join(hw.cpu_flags) or 'none of avx512*/amx*'}), "
        f"{hw.threads} threads, torch {torch.__version__}; batch 1, size={args.size}, "
        f"{args.repeat} interleaved rounds after one warm-up",
        "",
        "| pipeline | leaf casts installed | checks per run | without (s) | with (s) | end-to-end ratio | cost of the checks |",
        "|---|---|---|---|---|---|---|",
    ]
    cost = per_call_cost()
    for name in args.pipelines.split(","):
        repeat = args.repeat * (20 if name.strip() == "minilm" else 1)  # short runs: more rounds
        without, with_, hooks, calls = bench(name.strip(), args.size, repeat)
        lines.append(f"| {name} | {hooks} | {calls} | {without:.4f} | {with_:.4f} | {100 * (with_ / without - 1):+.2f}% | "
                     f"{100 * calls * cost / without:.2f}% |")
        print(lines[-1], flush=True)
    lines += ["", f"One check, input already in the right dtype: {cost * 1e6:.2f} µs (fastest of 7 interleaved rounds of "
              "2,000 calls of a small Linear, with and without the wrapper). 'cost of the checks' = checks per run x "
              "that cost / the run's median time: the overhead itself; the end-to-end ratio also holds the machine's noise."]
    return finish(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
