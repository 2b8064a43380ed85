"""Eager cost of fp32 compute from 16-bit weights: upcast copies (now) vs swapping param.data (before).

The ``memory`` strategy stores weights in bf16 and computes in fp32. mixprec used to
swap each module's ``param.data`` to an fp32 copy for the duration of its forward (a
pre-hook and a post-hook per module), which ``torch.compile`` cannot trace. It now gives
each such module a forward that reads upcast copies of its weights
(:mod:`mixprec.casting.fp32compute`). This runs the same applied pipeline three ways, in
interleaved rounds: fp32 (nothing applied), the current fp32 compute, and the former
data swap (re-created here on exactly the modules the policy computes in fp32), and
reports the medians and their ratios to fp32.

Usage:
    HF_HUB_OFFLINE=1 python benchmarks/bench_fp32_compute.py [--pipeline minilm] [--size default] [--repeat 7] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from _report import finish, speedup

import mixprec
from mixprec import hardware, pipelines
from mixprec.casting.fp32compute import ComputeIn
from mixprec.casting.hooks import cast_floats, own_tensors
from mixprec.policy import Policy, Rule


class DataSwap:
    """The former implementation: swap param.data to fp32 around each forward."""

    def __init__(self, module: torch.nn.Module):
        self.stash: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        self.handles = [module.register_forward_pre_hook(self.pre, with_kwargs=True),
                        module.register_forward_hook(self.post, always_call=True)]

    def pre(self, module, args, kwargs):
        saved = []
        for _, t in own_tensors(module):
            if t.is_floating_point() and t.dtype != torch.float32:
                saved.append((t, t.data))
                t.data = t.data.float()
        self.stash.append(saved)
        return cast_floats(args, torch.float32), cast_floats(kwargs, torch.float32) if kwargs else kwargs

    def post(self, module, args, output):
        for t, data in self.stash.pop() if self.stash else []:
            t.data = data

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def bench(name: str, size: str, repeat: int) -> dict[str, list[float]]:
    pipe = pipelines.get(name, size=size, seed=0)
    inputs = pipe.example_inputs(1, 0)
    policy = Policy((Rule("*", storage="bf16", compute="fp32"),), name="bf16-storage-fp32-compute")
    times: dict[str, list[float]] = {"fp32": [], "upcast copies": [], "data swap": []}
    applied = None
    current: list[ComputeIn] = []
    swaps: list[DataSwap] = []

    def switch(mode: str) -> None:
        nonlocal applied, current, swaps
        for swap in swaps:
            swap.remove()
        swaps = []
        if mode == "fp32":
            if applied is not None:
                applied.revert()
                applied = None
            return
        if applied is None:
            applied = mixprec.apply(pipe, policy)
            current = [h for h in applied._handles if isinstance(h, ComputeIn)]
        for handle in current:
            if mode == "upcast copies":
                if handle.module.__dict__.get("forward") is not handle.wrapper:
                    handle.install(handle.module)
            else:
                handle.remove()
                swaps.append(DataSwap(handle.module))

    with torch.inference_mode():
        for round_index in range(repeat + 1):
            order = list(times) if round_index % 2 else list(reversed(times))
            for mode in order:
                switch(mode)
                start = time.perf_counter()
                pipe.run(inputs)
                if round_index:
                    times[mode].append(time.perf_counter() - start)
    switch("fp32")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="minilm")
    parser.add_argument("--size", default="default")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    hw = hardware.probe()
    times = bench(args.pipeline, args.size, args.repeat)
    lines = [f"# fp32 compute from bf16 weights: eager cost ({args.pipeline}, size {args.size}, batch 1)", "",
             f"Machine: {hw.name}, {hw.threads} threads, CPU flags {' '.join(hw.cpu_flags) or 'none of interest'}; "
             f"torch {torch.__version__}. Medians of {args.repeat} interleaved rounds; vs fp32: the median of the "
             "per-round ratios and its 95 % interval (a figure only where it lies wholly on one side of 1).", "",
             "| fp32 compute | median | vs fp32 |", "|---|---|---|"]
    for mode, samples in times.items():
        shown = "reference" if mode == "fp32" else speedup(times["fp32"], samples)
        lines.append(f"| {mode} | {statistics.median(samples) * 1000:.1f} ms | {shown} |")
    lines += ["", f"Command: `HF_HUB_OFFLINE=1 python benchmarks/bench_fp32_compute.py --pipeline {args.pipeline} "
                  f"--size {args.size} --repeat {args.repeat}`"]
    return finish(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
