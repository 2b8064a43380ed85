"""fp8 weight storage: what it costs per layer against bf16, and what a tuned fp8 policy holds on unseen seeds.

Two questions, one script:

* ``--layers``: the eager time of one layer with fp8 weights (dequantised into bf16 per
  call) against the same layer with bf16 weights, for Linear shapes of the reference
  pipelines and a few batch sizes. Interleaved A-B-B-A rounds on this thread, paired
  ratios with their spread.
* ``--policy FILE --pipeline minilm``: a policy (``mixprec tune --objective memory --out
  FILE``) on seeds the search never saw: the worst cosine and SQNR of the pipeline's
  output against fp32 per seed, and its weight bytes against fp32 and bf16.

Usage:
    HF_HUB_OFFLINE=1 python benchmarks/bench_fp8.py --layers [--repeat 15] [--out FILE]
    HF_HUB_OFFLINE=1 python benchmarks/bench_fp8.py --policy minilm-fp8.toml --pipeline minilm --seeds 10-29 [--batch 1] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time

import torch
from _report import finish, speedup

import mixprec
from mixprec import Policy, Rule, hardware, pipelines
from mixprec.measure.metrics import quality

FP8 = Policy((Rule("*", storage="fp8"),), name="fp8")
BF16 = Policy((Rule("*", storage="bf16"),), name="bf16")
FP8_NAMED = Policy((Rule("*", storage="fp8"), Rule("0", storage="fp8")), name="fp8")
SHAPES = [(384, 1536), (1536, 384), (1024, 1024), (4096, 1024)]
BATCHES = [1, 16, 256]


def _cpu() -> str:
    hw = hardware.probe(use_cache=True, layers=False)
    return f"{hw.name}; torch {torch.__version__}; {torch.get_num_threads()} thread(s); {platform.python_version()}"


def _time(fn, n: int = 5) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n


def layers(repeat: int) -> list[str]:
    lines = ["| Linear (in x out) | batch | bf16 weights, ms | fp8 weights, ms | bf16 / fp8 speed |",
             "|---|---|---|---|---|"]
    for fan_in, fan_out in SHAPES:
        for batch in BATCHES:
            torch.manual_seed(0)
            a, b = torch.nn.Sequential(torch.nn.Linear(fan_in, fan_out)), torch.nn.Sequential(torch.nn.Linear(fan_in, fan_out))
            b.load_state_dict(a.state_dict())
            x = torch.randn(batch, fan_in, dtype=torch.bfloat16)
            # the layer is named: a component's first weight otherwise stays 16-bit (apps read its dtype)
            with torch.no_grad(), mixprec.apply(a, BF16), mixprec.apply(b, FP8_NAMED):
                assert b[0].weight.dtype == torch.float8_e4m3fn and a[0].weight.dtype == torch.bfloat16
                a(x), b(x)  # warm
                times: dict[str, list[float]] = {"bf16": [], "fp8": []}
                for i in range(repeat):
                    order = ("bf16", "fp8", "fp8", "bf16") if i % 2 == 0 else ("fp8", "bf16", "bf16", "fp8")
                    for label in order:
                        layer = a if label == "bf16" else b
                        times[label].append(_time(lambda: layer(x)))
            lines.append(f"| {fan_in} x {fan_out} | {batch} | {1e3 * sorted(times['bf16'])[len(times['bf16']) // 2]:.3f} | "
                         f"{1e3 * sorted(times['fp8'])[len(times['fp8']) // 2]:.3f} | {speedup(times['bf16'], times['fp8'])} |")
    return lines


def _seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def policy_on_unseen(path: str, pipeline: str, size: str, seeds: list[int], batch: int) -> list[str]:
    policy = Policy.load(path)
    pipe = pipelines.get(pipeline, size=size, seed=0)
    fp32_bytes = mixprec.weight_bytes(pipe)
    worst: dict[str, float] = {}
    rows = []
    for seed in seeds:
        inputs = pipe.example_inputs(batch, seed)
        with torch.no_grad():
            reference = pipe.run(inputs)
            with mixprec.apply(pipe, policy) as applied:
                out = pipe.run(inputs)
                fp8_bytes = applied.weight_bytes()
        found = quality(out.output, reference.output, pipe.output_kind)
        rows.append((seed, found))
        for key in ("cosine", "sqnr_db", "embedding_cosine_min"):
            if found.get(key) is not None:
                worst[key] = min(worst.get(key, math.inf), found[key])
    with mixprec.apply(pipe, BF16) as applied:
        bf16_bytes = applied.weight_bytes()
    lines = [f"policy {path} on {pipeline} ({size}, batch {batch}), seeds {seeds[0]}..{seeds[-1]} ({len(seeds)} seeds)", "",
             "| seed | cosine | min cosine of one output | SQNR dB |", "|---|---|---|---|"]
    lines += [f"| {seed} | {q.get('cosine') or float('nan'):.6f} | {q.get('embedding_cosine_min') or float('nan'):.6f} | "
              f"{q.get('sqnr_db') or float('nan'):.1f} |" for seed, q in rows]
    lines += ["", f"worst cosine {worst.get('cosine', float('nan')):.6f}, worst single-output cosine "
              f"{worst.get('embedding_cosine_min', float('nan')):.6f}, worst SQNR {worst.get('sqnr_db', float('nan')):.1f} dB; "
              f"weights {fp8_bytes / 2**20:.1f} MiB = {fp8_bytes / fp32_bytes:.3f}x fp32 ({fp32_bytes / 2**20:.1f} MiB), "
              f"{fp8_bytes / bf16_bytes:.3f}x bf16 ({bf16_bytes / 2**20:.1f} MiB)"]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", action="store_true", help="time fp8 against bf16 weights per Linear layer")
    parser.add_argument("--policy", help="a policy file to check on unseen seeds")
    parser.add_argument("--pipeline", default="minilm")
    parser.add_argument("--size", default="default", choices=("test", "default", "large"))
    parser.add_argument("--seeds", default="10-29", help="seeds: 'a-b' or a comma-separated list")
    parser.add_argument("--batch", type=int, default=1, help="batch of each run (mixprec tune measures batch 1)")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if not args.layers and not args.policy:
        parser.error("give --layers, --policy FILE, or both")
    torch.set_num_threads(args.threads)
    lines = [f"# fp8 weights ({_cpu()})", "", f"command: python benchmarks/bench_fp8.py {' '.join(argv or sys.argv[1:])}", ""]
    if args.layers:
        lines += ["## One Linear layer: fp8 against bf16 weights (bf16 compute, CPU time per call, paired rounds)", ""]
        lines += layers(args.repeat) + [""]
    if args.policy:
        lines += ["## The policy on seeds the search never saw", ""] + policy_on_unseen(args.policy, args.pipeline, args.size,
                                                                                      _seeds(args.seeds), args.batch)
    return finish(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
