"""Speed ratios with their paired intervals on a quiet machine and beside a CPU hog.

Runs ``mixprec bench`` on each pipeline twice, into one store: once on the machine as
it is, once while a hog keeps every core busy (one process per core spinning in pure
Python). Each configuration's speed-up against its own run's fp32 comes from paired
rounds with a bootstrap interval (``speedup_ci_low``/``speedup_ci_high``); the table
puts both runs side by side, with the verdict each interval supports, the run's notes
on instability and the load average seen. Decisions made on the loaded run must not
contradict the quiet one: where load widens an interval, the verdict becomes
"undecided", never the opposite of the quiet verdict.

Usage:
    HF_HUB_OFFLINE=1 python benchmarks/bench_noise.py [--pipelines tts,minilm] [--configs fp32,fast,memory]
        [--size default] [--repeat 8] [--out benchmarks/results/noise-<cpu>.md]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _report import finish

from mixprec import hardware
from mixprec.bench.store import Store
from mixprec.measure.stats import Ratio


def _spin(stop) -> None:  # pragma: no cover - runs in the hog's processes
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


class Hog:
    """One spinning process per core while the block runs."""

    def __enter__(self) -> Hog:
        ctx = mp.get_context("spawn")
        self.stop = ctx.Event()
        self.procs = [ctx.Process(target=_spin, args=(self.stop,), daemon=True) for _ in range(os.cpu_count() or 1)]
        for p in self.procs:
            p.start()
        time.sleep(1.0)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()


def bench(pipeline: str, configs: str, size: str, repeat: int, db: Path) -> tuple[int, float, float]:
    """Run ``mixprec bench``; returns (run id, wall seconds, load average at the end)."""
    start = time.perf_counter()
    cmd = [sys.executable, "-c", "import sys; from mixprec.cli import main; sys.exit(main())", "bench", "--pipeline", pipeline, "--configs", configs, "--size", size,
           "--repeat", str(repeat), "--warmup", "1", "--db", str(db)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")
    with Store(db) as store:
        run_id = store.runs(limit=1)[0]["id"]
    return run_id, time.perf_counter() - start, os.getloadavg()[0]


def _ratio(metrics: dict) -> Ratio | None:
    keys = ("speedup", "speedup_ci_low", "speedup_ci_high", "speedup_pairs")
    if any(metrics.get(k) is None for k in keys):
        return None
    return Ratio(metrics["speedup"], metrics["speedup_ci_low"], metrics["speedup_ci_high"], int(metrics["speedup_pairs"]),
                 exact=int(metrics["speedup_pairs"]) >= 5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", default="tts,minilm")
    parser.add_argument("--configs", default="fp32,fast,memory")
    parser.add_argument("--size", default="default")
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    hw = hardware.probe()
    lines = [
        f"$ HF_HUB_OFFLINE=1 python benchmarks/bench_noise.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip(),
        "",
        f"device: {hw.device_type} ({hw.name}; CPU flags: {', '.join(hw.cpu_flags) or 'none of avx512*/amx*'}), "
        f"{hw.threads} threads; probe: bf16 {hw.dtypes['bf16'].klass} ({hw.dtypes['bf16'].ratio}x), "
        f"fp16 {hw.dtypes['fp16'].klass} ({hw.dtypes['fp16'].ratio}x); size={args.size}, 1 warm-up + "
        f"{args.repeat} timed rounds; loaded = one spinning process per core beside the benchmark",
        "",
        "| pipeline | config | quiet: speed-up (95 % interval) | verdict | loaded: speed-up (95 % interval) | verdict | agree |",
        "|---|---|---|---|---|---|---|",
    ]
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "noise.sqlite"
        for pipeline in args.pipelines.split(","):
            quiet_id, quiet_s, quiet_load = bench(pipeline, args.configs, args.size, args.repeat, db)
            with Hog():
                loaded_id, loaded_s, loaded_load = bench(pipeline, args.configs, args.size, args.repeat, db)
            with Store(db) as store:
                quiet, loaded = store.load_run(quiet_id), store.load_run(loaded_id)
            notes.append(f"{pipeline}: quiet run {quiet_s:.0f} s (load average {quiet_load:.1f}), loaded run "
                         f"{loaded_s:.0f} s (load average {loaded_load:.1f})")
            notes += [f"{pipeline} loaded run note: {n}" for n in loaded["notes"] if "unstable" in n or "undecided" in n]
            for q, ld in zip(quiet["configs"], loaded["configs"]):
                rq, rl = _ratio(q["metrics"]), _ratio(ld["metrics"])
                reference = q["name"] == "fp32"
                vq = "reference" if reference else (rq.verdict() if rq else "-")
                vl = "reference" if reference else (rl.verdict() if rl else "-")
                agree = "yes" if vq == vl or "undecided" in (vq, vl) else "NO"
                lines.append(f"| {pipeline} | {q['name']} | {rq.text() if rq else '-'} | {vq} | "
                             f"{rl.text() if rl else '-'} | {vl} | {agree} |")
                print(lines[-1], flush=True)
    lines += ["", "verdict: 'above' = faster than fp32 over the whole interval, 'below' = slower, 'undecided' = the "
              "interval holds 1. 'agree': the loaded verdict is the quiet one or undecided (never the opposite).", ""]
    lines += [f"- {n}" for n in notes]
    return finish(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
