"""The GPU check: what mixprec does on one GPU, in one call, written to one results file.

Steps (each bounded in time; a step that fails or runs out of time is recorded and the
check goes on):

1. **Numerics**: ``ACE_STEP_FLOAT32_MATMUL_PRECISION=high`` read by
   ``mixprec.init(app="ACE_STEP")``: what torch reads back (legacy flags and the
   ``fp32_precision`` tree), an n³ fp32 matmul's speed and error at each level and in
   bf16 / fp16, and the state after ``mixprec.restore``.
2. ``mixprec env --device DEVICE``: the probe, its classes and layer islands.
3. ``mixprec bench`` of the tts and diffusion reference pipelines at ``--size`` (``large``:
   Chatterbox-scale and SD-1.5-scale) under every configuration: fp32, TF32, autocast,
   the naive casts, the presets, and compiled twins; within a ``--budget`` per pipeline.
4. ``mixprec calibrate --preset fast`` of each pipeline at ``--size``: the decision and the
   time it took against its ``--calibrate-limit`` (default 30 s).
5. What mixprec adds per run: ``benchmarks/bench_overhead.py`` (presets, and presets
   calibrated on the pipeline (``fast+calibrated``: their candidates timed with CUDA
   events, within ``--calibrate-limit`` where given, else bench_overhead.py's 20 s), against
   fp32 and the naive casts in paired rounds (``--rounds``, default 4), and the Python
   calls mixprec makes per run).
6. The numerics guard's cost: the tts pipeline under ``fast``, with and without
   ``mixprec.guard``, in interleaved rounds (``--rounds``, default 6).
7. Compiled token decode (``benchmarks/bench_compile.py``): tts under ``fast`` compiled with
   CUDA graphs (``fast+compile:graphs``, its decoder on a static key/value cache) against
   fp32 eager, ``fast`` eager and ``naive-bf16+compile``, with recompile counts, over
   ``--rounds`` timed rounds (default 3; on a CPU ``fast`` against ``fast+compile`` over
   1). ``--compile-only t3`` compiles the token decoder alone (default: every component).

The results file is rewritten after every step, so a check cut short keeps what it measured;
``--time-limit`` bounds the whole check (a device lease of fixed length): each step gets at
most what is left, and one with under a minute left is recorded as skipped.

The file names the GPU, its driver and torch. On a machine with torch and most
dependencies preinstalled and no network, put ``src/`` on ``PYTHONPATH`` and install the
missing pure-Python wheels first (README, "On a GPU"). ``--device cpu --size test`` is
the dry run (a few minutes on 2 cores). The quick dry run, each step at its smallest
(what ``tests/bench/test_gpu_check.py`` runs: about 90 s of CPU time, 165 s without
the last three options): ``--device cpu --pipelines tts --configs fp32,fast --budget 10
--calibrate-limit 5 --rounds 2 --compile-only t3``; on a CPU inductor builds C++ for
every kernel, and ``--compile-only t3`` builds the token decoder's 18 of tts's 61
(the other components' tracing is tested with the eager backend in ``tests/casting``).

Usage:
    HF_HUB_OFFLINE=1 python benchmarks/gpu_check.py [--device cuda] [--size large] [--budget 150]
        [--pipelines tts,diffusion] [--configs ...] [--out-dir benchmarks/results]
        [--time-limit 500] [--calibrate-limit 30] [--rounds N] [--compile-only t3]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CONFIGS = "fp32,matmul-high,autocast-bf16,autocast-fp16,naive-bf16,naive-fp16,quality,balanced,fast,memory,fp8"
#: Compiled twins, on a GPU only: on a CPU inductor spends minutes generating C++ for them.
COMPILED = ",fast+compile,naive-bf16+compile"
CLI = [sys.executable, "-c", "from mixprec.cli import main; main()"]


def _run(title: str, argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> list[str]:
    """Run one step in its own process; its output (or why there is none) as markdown lines."""
    start = time.monotonic()
    # Its own process group: a step stopped at its limit takes the workers it started with it.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        body, _ = proc.communicate(timeout=timeout_s)
        status = f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        body, _ = proc.communicate()
        status = f"stopped after {timeout_s:.0f} s"
    lines = [line for line in body.splitlines() if not re.search(r"FutureWarning|warnings.warn|return forward_call", line)]
    took = time.monotonic() - start
    print(f"[{took:5.0f} s] {title}: {status}", flush=True)
    return [f"## {title}", "", f"`{' '.join(_shown(argv))}`: {status}, {took:.0f} s", "", "```", *lines[-80:], "```", ""]


def _shown(argv: list[str]) -> list[str]:
    return ["mixprec", *argv[len(CLI):]] if argv[:len(CLI)] == CLI else [Path(argv[0]).name, *argv[1:]]


def _numerics(device: str) -> list[str]:
    """The seed feature on this device, in this process (mixprec.init writes torch's flags)."""
    import mixprec

    os.environ["ACE_STEP_FLOAT32_MATMUL_PRECISION"] = "high"
    resolved = mixprec.init(app="ACE_STEP")
    lines = ["## Numerics: ACE_STEP_FLOAT32_MATMUL_PRECISION=high through mixprec.init(app=\"ACE_STEP\")", "",
             f"- init: `{resolved.numeric}`",
             f"- torch reads back: get_float32_matmul_precision = `{torch.get_float32_matmul_precision()}`, "
             f"cuda.matmul.allow_tf32 = `{torch.backends.cuda.matmul.allow_tf32}`, cudnn.allow_tf32 = `{torch.backends.cudnn.allow_tf32}`",
             f"- mixprec.describe(): `{mixprec.describe()}`"]
    mixprec.restore(resolved.previous)
    os.environ.pop("ACE_STEP_FLOAT32_MATMUL_PRECISION")
    lines.append(f"- after restore: get_float32_matmul_precision = `{torch.get_float32_matmul_precision()}`")
    cuda = device.startswith("cuda")
    n = 8192 if cuda else 256  # on a CPU the dry run: bf16 and fp16 are emulated on many (about 1 GFLOP/s)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=gen).to(device), torch.randn(n, n, generator=gen).to(device)
    exact = a.double() @ b.double()

    def best(fn) -> float:
        fn()
        sync()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - start)
        return min(times)

    rows, base = [], None
    cases = [(level, torch.float32) for level in ("highest", "high", "medium")] + [("-", torch.bfloat16), ("-", torch.float16)]
    for level, dtype in cases:
        x, y = a.to(dtype), b.to(dtype)
        with mixprec.numerics(matmul=level if level != "-" else "highest"):
            seconds = best(lambda: x @ y)
            err = ((x @ y).double() - exact).norm().item() / exact.norm().item()
        base = base or seconds
        rows.append(f"| {str(dtype).replace('torch.', '')} | {level} | {seconds * 1e3:.3f} | {2 * n ** 3 / seconds / 1e12:.1f} "
                    f"| {base / seconds:.2f}x | {err:.1e} |")
    return lines + ["", f"{n}³ matmul on {device}, best of 5:", "", "| dtype | matmul precision | ms | TFLOP/s | vs fp32 highest | rel. error vs fp64 |",
                    "|---|---|---|---|---|---|", *rows, ""]


def _guard_cost(device: str, size: str, rounds: int = 6) -> list[str]:
    """fast alone against fast under the guard (one finiteness check per component call), interleaved."""
    import mixprec
    from mixprec import pipelines

    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    pipe = pipelines.get("tts", size=size, seed=0, device=device)
    inputs = pipe.example_inputs(1, 0)
    reference = pipe.run(inputs)

    def timed() -> float:
        sync()
        start = time.perf_counter()
        pipe.run(inputs, speech_tokens=reference.speech_tokens)
        sync()
        return time.perf_counter() - start

    ratios = []
    with mixprec.apply(pipe, mixprec.preset("fast", hardware=mixprec.hardware.probe(device))) as applied:
        for _ in range(3):
            timed()
        for index in range(rounds):
            order = (False, True) if index % 2 == 0 else (True, False)
            seconds = {}
            for guarded in order:
                if guarded:
                    with mixprec.guard(applied, on_nonfinite="fallback", remember=False):
                        timed()
                        seconds[guarded] = timed()
                else:
                    seconds[guarded] = timed()
            ratios.append(seconds[True] / seconds[False])
    return ["## The numerics guard's cost (tts, fast, teacher-forced)", "",
            f"guarded / unguarded time, {rounds} interleaved rounds: median {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f}-{max(ratios):.3f})", ""]


def _machine(device: str) -> list[str]:
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=20).stdout.strip() or "unknown"
        except (OSError, subprocess.TimeoutExpired):
            driver = "unknown (no nvidia-smi)"
        what = (f"GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, compute capability {props.major}.{props.minor}; "
                f"driver {driver}; CUDA {torch.version.cuda}")
    else:
        what = f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores (a dry run: no GPU)"
    return [what, f"torch {torch.__version__}, Python {platform.python_version()}"]


def _name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(0).lower()).strip("-")
    return "cpu-dry-run"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", default=None, help="pipeline size (default: large on CUDA, test on a CPU)")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds for each pipeline's bench")
    parser.add_argument("--configs", default=None, help=f"default: {CONFIGS}, with{COMPILED} on CUDA")
    parser.add_argument("--pipelines", default="tts,diffusion")
    parser.add_argument("--out-dir", default=str(HERE / "results"))
    parser.add_argument("--calibrate-limit", type=float, default=None,
                        help="calibrate's --time-limit per pipeline (default 30), and where given the overhead step's "
                             "--calibration-limit for its +calibrated presets (default there 20)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="timed rounds of the overhead, guard and compiled-decode steps (default 4, 6, and 3 on "
                             "CUDA / 1 on a CPU)")
    parser.add_argument("--compile-only", metavar="COMPONENTS", default=None,
                        help="compile only these tts components in the compiled-decode step, e.g. t3 (the token "
                             "decoder; on a CPU every component's C++ takes about a minute); default: all")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="seconds for the whole check: each step's own limit is cut to what is left, and a step "
                             "with under a minute left is recorded as skipped (for a device lease of fixed length)")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: give at least 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA device here; use --device cpu for the dry run")
    cuda = args.device.startswith("cuda")
    size = args.size or ("large" if cuda else "test")
    configs = args.configs or (CONFIGS + COMPILED if cuda else CONFIGS)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu-{_name(args.device)}.md"

    def save() -> None:
        path.write_text("\n".join(lines) + "\n")

    def left(limit: float) -> float:
        """A step's time limit: its own, or what the whole check has left (0: skip the step)."""
        if args.time_limit is None:
            return limit
        remaining = args.time_limit - (time.monotonic() - started)
        return min(limit, remaining) if remaining >= 60 else 0.0

    def step(title: str, argv_: list[str], limit: float) -> list[str]:
        limit = left(limit)
        if not limit:
            print(f"[skipped] {title}: under a minute of --time-limit left", flush=True)
            return [f"## {title}", "", f"skipped: under a minute of the {args.time_limit:.0f} s time limit was left", ""]
        return _run(title, argv_, limit, env)
    env = {"HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg", "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    lines = [f"# GPU check on {_name(args.device)}", "",
             f"$ HF_HUB_OFFLINE=1 python benchmarks/gpu_check.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip(),
             "", *_machine(args.device), f"pipeline size: {size}", ""]
    lines += _numerics(args.device)
    save()
    lines += step("mixprec env", [*CLI, "env", "--device", args.device], 120)
    save()
    db = str(out / f"gpu-{_name(args.device)}.sqlite")
    pipelines = [p.strip() for p in args.pipelines.split(",") if p.strip()]
    for pipeline in pipelines:
        lines += step(f"mixprec bench: {pipeline}", [*CLI, "bench", "--pipeline", pipeline, "--size", size, "--device", args.device,
                                                     "--configs", configs, "--budget", f"{args.budget:.0f}s", "--db", db],
                      args.budget * 1.5 + 120)
        save()
    # Calibration at the sizes users run: the decision and the time it took (its limit included).
    calibrate_limit = 30.0 if args.calibrate_limit is None else args.calibrate_limit
    for pipeline in pipelines:
        lines += step(f"mixprec calibrate: {pipeline}", [*CLI, "calibrate", "--pipeline", pipeline, "--size", size, "--device",
                                                         args.device, "--preset", "fast", "--no-cache", "--time-limit",
                                                         f"{calibrate_limit:g}"],
                      calibrate_limit * 2 + 60)
        save()
    # bench_overhead.py reverts in place: fp32, the naive casts and the presets only.
    # (no compiled twin: "naive-bf16+compile" is a configuration bench_overhead.py refuses).
    overhead = [c for c in configs.split(",") if c in ("fp32", "quality", "balanced", "fast", "memory")
                or (c.startswith("naive-") and "+" not in c)]
    overhead += [f"{p}+calibrated" for p in ("balanced", "fast", "memory") if p in overhead]
    calibration = [] if args.calibrate_limit is None else ["--calibration-limit", f"{args.calibrate_limit:g}"]
    lines += step("What mixprec adds per run", [sys.executable, str(HERE / "bench_overhead.py"), "--pipelines", ",".join(pipelines),
                                                "--sizes", size, "--device", args.device, "--repeat", str(args.rounds or 4),
                                                "--calls", "2", "--configs", ",".join(overhead), *calibration],
                  max(300.0, args.budget * 2))
    save()
    if "tts" in pipelines:
        if left(60):
            lines += _guard_cost(args.device, size, args.rounds or 6)
            save()
        # The dry run on a CPU checks the step with one compile; the GPU compares all four.
        compared = "fp32,fast,naive-bf16+compile,fast+compile:graphs" if cuda else "fast,fast+compile"
        only = [] if args.compile_only is None else ["--compile-only", args.compile_only]
        lines += step("Compiled token decode (tts)", [sys.executable, str(HERE / "bench_compile.py"), "--pipelines", "tts",
                                                      "--size", size, "--device", args.device,
                                                      "--repeat", str(args.rounds or (3 if cuda else 1)),
                                                      "--configs", compared, *only],
                      300)
    lines.append(f"The whole check took {time.monotonic() - started:.0f} s.")
    save()
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
