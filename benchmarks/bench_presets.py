"""Presets side by side with fp32 and torch.autocast(bfloat16), on the reference pipelines.

Every configuration runs the same pipeline object on the same inputs in one process.
Repetitions are interleaved across configurations (round r times every configuration
once) so the noise of a shared machine spreads evenly, and each configuration's
speed-up is the median of its per-round ratios to fp32 with their 95 % interval, shown as
every mixprec table shows it (a figure only where the interval lies wholly on one side of 1;
fewer than 3 rounds read ``undecided (n=2)``). Policies are applied
before and reverted after each timed call; warm-up calls are not timed.

Quality is the SQNR of the output against the fp32 output (tts: on the fp32 run's
speech tokens, teacher-forced, so waveforms are comparable sample by sample).

Usage:
    HF_HUB_OFFLINE=1 python benchmarks/bench_presets.py [--pipelines tts,diffusion,minilm]
        [--size default] [--repeat 3] [--out benchmarks/results/presets.md]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import torch
from _report import finish, speedup

import mixprec
from mixprec import hardware, pipelines

CONFIGS = ("fp32", "autocast-bf16", "quality", "balanced", "fast", "memory")


def sqnr_db(out: torch.Tensor, ref: torch.Tensor) -> float:
    noise = (out.float() - ref.float()).pow(2).mean().item()
    signal = ref.float().pow(2).mean().item()
    return float("inf") if noise == 0 else 10.0 * torch.log10(torch.tensor(signal / noise)).item()


def bench_pipeline(name: str, size: str, repeat: int, hw: hardware.Hardware) -> list[dict]:
    pipe = pipelines.get(name, size=size, seed=0)
    inputs = pipe.example_inputs(1, 0)
    reference = pipe.run(inputs)
    kwargs = {"speech_tokens": reference.speech_tokens} if name == "tts" else {}
    policies = {p: mixprec.preset(p, hardware=hw, hints=tuple(pipe.sensitive)) for p in ("quality", "balanced", "fast", "memory")}
    fp32_bytes = mixprec.weight_bytes(pipe)

    def context(config: str):
        if config == "fp32":
            return contextlib.nullcontext()
        if config == "autocast-bf16":
            return torch.autocast(device_type="cpu", dtype=torch.bfloat16)
        return mixprec.apply(pipe, policies[config])

    times: dict[str, list[float]] = {c: [] for c in CONFIGS}
    quality: dict[str, float] = {}
    memory: dict[str, int] = {}
    for round_index in range(repeat + 1):  # round 0 is the warm-up
        for config in CONFIGS:
            with context(config) as applied:
                start = time.perf_counter()
                out = pipe.run(inputs, **kwargs)
                elapsed = time.perf_counter() - start
                if round_index == 0:
                    quality[config] = sqnr_db(out.output, reference.output)
                    memory[config] = applied.weight_bytes() if isinstance(applied, mixprec.Applied) else fp32_bytes
                else:
                    times[config].append(elapsed)
    rows = []
    for config in CONFIGS:
        med = statistics.median(times[config])
        rows.append({
            "pipeline": name, "config": config, "median_s": med,
            "speedup": "reference" if config == "fp32" else speedup(times["fp32"], times[config]),
            "sqnr_db": quality[config], "weight_ratio": memory[config] / fp32_bytes,
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", default="tts,diffusion,minilm")
    parser.add_argument("--size", default="default")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    hw = hardware.probe()
    lines = [
        f"$ HF_HUB_OFFLINE=1 python benchmarks/bench_presets.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip(),
        "",
        f"device: {hw.device_type} ({hw.name}), {hw.threads} threads, torch {torch.__version__}; "
        "probe: " + ", ".join(f"{d} {hw.dtypes[d].klass} ({hardware.ratio_text(hw.dtypes[d].ratio, hw.dtypes[d].klass)})"
                              for d in ("bf16", "fp16")),
        f"batch 1, size={args.size}, {args.repeat} interleaved repetitions after one warm-up; speedup = median of the "
        "per-round fp32 / config ratios (95 % interval)",
        "",
        "| pipeline | config | median s | speedup vs fp32 | SQNR vs fp32 (dB) | weight bytes vs fp32 |",
        "|---|---|---|---|---|---|",
    ]
    for name in args.pipelines.split(","):
        for row in bench_pipeline(name.strip(), args.size, args.repeat, hw):
            lines.append(f"| {row['pipeline']} | {row['config']} | {row['median_s']:.3f} | {row['speedup']} | "
                         f"{row['sqnr_db']:.1f} | {row['weight_ratio']:.3f} |")
            print(lines[-1], flush=True)
    return finish(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
