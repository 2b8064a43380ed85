"""Where a reference pipeline's time goes, per component, and what bf16 on one component alone gains.

For each pipeline: one fp32 run with every component's outermost entry calls (``forward`` and
its own methods, as the guard sees them) timed on the device's clock (CUDA events on a GPU, CPU
time on a CPU); then, per component, the pipeline run with that component alone stored and
computed in bf16 through ``mixprec.apply`` (mixprec casts at its boundaries), against fp32, in
interleaved rounds (fp32, component in bf16, fp32, ...), with its output SQNR against fp32
(teacher-forced). The per-component figures are what a calibration deciding per component
works from; the sum of the per-component gains against the all-bf16 run shows how far they add.

Usage:
    HF_HUB_OFFLINE=1 python benchmarks/component_shares.py --pipelines tts,diffusion --size default \
        [--device cuda] [--rounds 3] [--dtype bf16] [--out benchmarks/results/component-shares-<machine>.md]
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from typing import Any

import torch

import mixprec
from mixprec import pipelines
from mixprec.calibration.trials import detached, device_of, output_quality
from mixprec.casting.hooks import add_method_hook
from mixprec.device.clock import clock_for
from mixprec.policy import Policy, Rule
from mixprec.policy.tree import called_children, entry_methods

from _report import db_text, pipeline_parser


def _entry_times(pipe: Any, run: Any) -> dict[str, list[float]]:
    """Per component: the device-clock seconds of each outermost entry call during ``run()``."""
    clock = clock_for(device_of(pipe.components))
    seconds: dict[str, list[float]] = {name: [] for name in pipe.components}
    depth: dict[str, int] = {name: 0 for name in pipe.components}
    handles = []
    for cname, root in pipe.components.items():
        owners = [root, *called_children(root)]
        for owner in owners:
            for method in entry_methods(owner):
                def around(call, args, kwargs, cname=cname):
                    if depth[cname]:
                        return call(*args, **kwargs)
                    depth[cname] += 1
                    try:
                        out, took = clock.time(lambda: call(*args, **kwargs))
                    finally:
                        depth[cname] -= 1
                    seconds[cname].append(took)
                    return out

                handles.append(add_method_hook(owner, method, around, priority=200))
    try:
        with torch.inference_mode():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return seconds


def _timed(run: Any, device: torch.device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    with torch.inference_mode():
        run()
    sync()
    return time.perf_counter() - start


def _pipeline_rows(name: str, size: str, device: str, rounds: int, dtype: str) -> list[str]:
    pipe = pipelines.get(name, size=size, seed=0, device=device)
    dev = device_of(pipe.components)
    inputs = pipe.example_inputs(1, 0)
    with torch.inference_mode():
        reference = pipe.run(inputs)
    forced = pipe.teacher_forced(inputs, reference)
    ref = detached(reference)

    def run() -> Any:
        return pipe.run(forced)

    _timed(run, dev)  # warm
    shares = _entry_times(pipe, run)
    total = _timed(run, dev)
    configs: dict[str, Policy] = {f"{c} in {dtype}": Policy((Rule(c, storage=dtype, reason=f"{c} alone in {dtype}"),), name=f"{c}-{dtype}")
                                  for c in pipe.components}
    configs[f"every component in {dtype}"] = Policy((Rule("*", storage=dtype, reason=f"all in {dtype}"),), name=f"all-{dtype}")
    results: dict[str, tuple[list[float], float]] = {}
    for label, policy in configs.items():
        ratios: list[float] = []
        applied = mixprec.apply(pipe, policy)
        with torch.inference_mode():
            sqnr, _ = output_quality(detached(run()), ref)
        _timed(run, dev)  # warm in this dtype
        for index in range(rounds):  # fp32 and the policy in alternating order (A-B, B-A, ...)
            times = {}
            for low in ((False, True) if index % 2 == 0 else (True, False)):
                if low and not applied.active:
                    applied = mixprec.apply(pipe, policy)
                elif not low and applied.active:
                    applied.revert()
                times[low] = _timed(run, dev)
            ratios.append(times[False] / times[True])
        if applied.active:
            applied.revert()
        results[label] = (ratios, sqnr)
    rows = [f"## {name} ({size}, batch 1) on {device}", "",
            f"one fp32 run: {total * 1e3:,.1f} ms of wall time; entry calls timed on the {clock_for(dev).name} clock", "",
            "| component | calls | seconds in fp32 | share of the timed calls | alone in " + dtype + ": speed vs fp32 (per-round range) | its output SQNR |",
            "|---|---|---|---|---|---|"]
    timed_total = sum(sum(v) for v in shares.values()) or 1.0
    for cname, values in shares.items():
        ratios, sqnr = results[f"{cname} in {dtype}"]
        rows.append(f"| {cname} | {len(values)} | {sum(values):.3f} | {sum(values) / timed_total:.0%} | "
                    f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}–{max(ratios):.2f}) | {db_text(sqnr)} |")
    ratios, sqnr = results[f"every component in {dtype}"]
    rows += [f"| every component | | | | {statistics.median(ratios):.2f}x ({min(ratios):.2f}–{max(ratios):.2f}) | {db_text(sqnr)} |", ""]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = pipeline_parser(__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    args = parser.parse_args(argv)
    if args.device.startswith("cpu"):
        torch.set_num_threads(1)
    machine = (torch.cuda.get_device_name(0) if args.device.startswith("cuda") else
               f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s)")
    lines = [f"# Per-component time and bf16 gain ({machine})", "",
             f"$ HF_HUB_OFFLINE=1 python benchmarks/component_shares.py {' '.join(argv if argv is not None else sys.argv[1:])}", "",
             f"torch {torch.__version__}, Python {platform.python_version()}, {os.cpu_count()} cores", ""]
    for name in [p.strip() for p in args.pipelines.split(",") if p.strip()]:
        lines += _pipeline_rows(name, args.size, args.device, args.rounds, args.dtype)
        print("\n".join(lines), flush=True) if args.out is None else None
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
