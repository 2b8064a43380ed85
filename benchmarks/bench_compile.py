"""Compiled presets against the compiled one-line cast and the same preset uncompiled.

Each configuration runs its own copy of the pipeline (the same seed, so the same
weights), set up as ``mixprec bench`` sets it up (``mixprec.bench.configs.setup``:
presets applied and guarded with ``on_nonfinite="fallback"``, ``+compile`` through the
policy's compile setting, a naive cast by compiling each component). A configuration
ending in ``:unguarded`` has its guard removed. tts is teacher-forced on the fp32 run's
speech tokens, so every configuration does the same work.

Round 0 compiles and warms up (its first call's wall time is the compile time); then
interleaved rounds whose order reverses every other round (A-B-B-A) time ``--calls``
calls per configuration with the device's clock (CPU time on a CPU), the fastest of
them counting for the round. Ratios are paired per round
(:func:`mixprec.measure.stats.paired_ratio`). Dynamo's recompile-limit warnings and the
graphs compiled after round 0 (recompiles) are counted per configuration.

``--processes`` then measures what a later process pays: the first compiled
configuration's first call in a fresh process with an empty inductor cache
(``TORCHINDUCTOR_CACHE_DIR`` set to a new folder), then in a second fresh process on the
same folder (torch's own FX-graph and AOT caches; Dynamo still traces in each process).

``--compile-only t3`` compiles only the named components of each compiled configuration
(the others run eager under the same preset; the table says which were compiled): on a
CPU inductor generates and builds C++ for every kernel of every component (tts at
``--size test``: about 60 kernels, a minute of CPU time), so a quick check compiles the
token decoder alone, its static key/value cache included. Default: every component.

Usage:
    HF_HUB_OFFLINE=1 python benchmarks/bench_compile.py [--pipelines tts,diffusion,minilm] [--size default]
        [--configs fast,naive-bf16+compile,fast+compile,fast+compile:unguarded] [--repeat 5] [--calls 1]
        [--threads 1] [--device cpu|cuda] [--components] [--processes] [--process-config fast+compile]
        [--compile-only t3] [--out FILE]

A label ending in ``:graphs`` (``fast+compile:graphs``) compiles with mode ``reduce-overhead``
(CUDA graphs on a GPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from _report import finish, speedup

import mixprec
from mixprec import hardware, pipelines
from mixprec.bench import configs
from mixprec.device import clock as mixprec_clock
from mixprec.measure.metrics import sqnr_db

CONFIGS = "fast,naive-bf16+compile,fast+compile,fast+compile:unguarded"
UNGUARDED = ":unguarded"
#: A compiled preset whose compile mode is ``reduce-overhead``: CUDA graphs on a GPU.
GRAPHS = ":graphs"


class LimitWarnings(logging.Handler):
    """Counts Dynamo's 'hit config.recompile_limit' warnings (older torch: cache_size_limit)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "recompile_limit" in message or "cache_size_limit" in message:
            self.count += 1


def graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def prepare(name: str, size: str, label: str, hw, device: str = "cpu", only: list[str] | None = None):
    """A fresh pipeline set up as ``label`` says; returns (pipeline, its guard or None).

    ``only``: the components left compiled (``--compile-only``); the others' compiled call is
    dropped before it first runs, so Dynamo never traces them and they run eager (``None``: all).
    """
    spec_name, unguarded = (label[: -len(UNGUARDED)], True) if label.endswith(UNGUARDED) else (label, False)
    spec_name, graphs = (spec_name[: -len(GRAPHS)], True) if spec_name.endswith(GRAPHS) else (spec_name, False)
    spec = next(s for s in configs.parse_configs(spec_name, hw)[0] if s.name == spec_name)
    pipe = pipelines.get(name, size=size, seed=0, device=device)
    if graphs:
        if spec.kind != "preset" or not spec.compile:
            raise SystemExit(f"{label}: {GRAPHS} takes a compiled preset, such as fast+compile{GRAPHS}")
        policy = mixprec.preset(spec.arg, hardware=hw, hints=tuple(pipe.sensitive),
                                overrides={"compile": {"mode": "reduce-overhead"}})
        info = {"guard": mixprec.guard(mixprec.apply(pipe, policy), on_nonfinite="fallback", hardware=hw, remember=False)}
    else:
        _, info = configs.setup(spec, pipe, hw)
    if only is not None:
        unknown = sorted(set(only) - set(pipe.components))
        if unknown:
            raise SystemExit(f"--compile-only: {name} has no component {', '.join(unknown)} "
                             f"(its components: {', '.join(pipe.components)})")
        for cname, component in pipe.components.items():
            if cname not in only:
                component._compiled_call_impl = None  # as Compiled.remove does: eager again, nothing traced
    guard = info.get("guard")
    if unguarded and guard is not None:
        guard.remove()
        guard = None
    return pipe, guard


def fp32_reference(name: str, size: str, device: str):
    """(inputs, the fp32 run's output, the run options that teacher-force tts on it)."""
    pipe = pipelines.get(name, size=size, seed=0, device=device)
    inputs = pipe.example_inputs(1, 0)
    with torch.no_grad():
        reference = pipe.run(inputs)
    return inputs, reference, ({"speech_tokens": reference.speech_tokens} if name == "tts" else {})


def bench(name: str, size: str, labels: list[str], repeat: int, calls: int, hw, device: str = "cpu",
          only: list[str] | None = None) -> list[str]:
    inputs, reference, kwargs = fp32_reference(name, size, device)
    clock = mixprec_clock.clock_for(device)
    limit = LimitWarnings()
    logging.getLogger("torch._dynamo").addHandler(limit)
    set_up = {label: prepare(name, size, label, hw, device, only) for label in labels}
    times: dict[str, list[float]] = {label: [] for label in labels}
    first: dict[str, float] = {}
    quality: dict[str, float] = {}
    limits: dict[str, int] = {}
    recompiles: dict[str, int] = {label: 0 for label in labels}
    for round_index in range(repeat + 1):
        for label in (labels if round_index % 2 else labels[::-1]):
            pipe, _ = set_up[label]

            def run(pipe=pipe):
                with torch.no_grad():
                    return pipe.run(inputs, **kwargs)

            if round_index == 0:
                before_limit = limit.count
                start = time.perf_counter()
                output = run()
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                first[label] = time.perf_counter() - start
                quality[label] = sqnr_db(output.output, reference.output)
                for _ in range(2):
                    run()
                limits[label] = limit.count - before_limit
                continue
            before = graphs()
            times[label].append(min(clock.time(run)[1] for _ in range(calls)))
            recompiles[label] += graphs() - before
    logging.getLogger("torch._dynamo").removeHandler(limit)
    base = labels[0]
    lines = [f"### {name}, size={size}, batch 1", "",
             f"| config | median ms ({clock.name}) | vs {base} (interval) | "
             + " | ".join(f"vs {other} (interval)" for other in labels[1:2]) + " | first call (s, wall) "
             "| recompile-limit warnings | graphs compiled after warm-up | SQNR vs fp32 (dB) |",
             "|---|---|---|---|---|---|---|---|"]
    for label in labels:
        t = times[label]
        lines.append(f"| {label} | {statistics.median(t) * 1e3:.1f} | {'reference' if label == base else speedup(times[base], t)} | "
                     + (" | ".join(speedup(times[other], t) if other != label else "reference" for other in labels[1:2]))
                     + f" | {first[label]:.1f} | {limits[label] + 0} | {recompiles[label]} | {quality[label]:.1f} |")
    if only is not None:
        lines.append(f"- compiled components (--compile-only): {', '.join(only)}; the others run eager")
    return lines + [""]


def components(name: str, size: str, labels: list[str], hw, device: str = "cpu", runs: int = 3,
               only: list[str] | None = None) -> list[str]:
    """CPU time of each component's calls in one run, per configuration (``--components``): where the time goes.

    Each component's call is timed through ``_compiled_call_impl`` (the compiled call, or
    the eager ``_call_impl`` put in its place), after two warm-up runs.
    """
    inputs, _, kwargs = fp32_reference(name, size, device)
    table: dict[str, dict[str, float]] = {}
    for label in labels:
        pipe, _ = prepare(name, size, label, hw, device, only)
        spent: dict[str, float] = {}
        with torch.no_grad():
            for _ in range(2):
                pipe.run(inputs, **kwargs)
            for cname, component in pipe.components.items():
                inner = component._compiled_call_impl or component._call_impl

                def timed(*args, _inner=inner, _name=cname, **kw):
                    start = time.thread_time()
                    try:
                        return _inner(*args, **kw)
                    finally:
                        spent[_name] = spent.get(_name, 0.0) + time.thread_time() - start

                component._compiled_call_impl = timed
            start = time.thread_time()
            for _ in range(runs):
                pipe.run(inputs, **kwargs)
            spent["(whole run)"] = time.thread_time() - start
        table[label] = {k: v / runs * 1e3 for k, v in spent.items()}
    names = list(next(iter(table.values())))
    return ([f"#### {name}: CPU ms per run in each component ({runs} runs)", "", "| component | " + " | ".join(labels) + " |",
             "|---|" + "---|" * len(labels)]
            + [f"| {c} | " + " | ".join(f"{table[label].get(c, 0.0):.0f}" for label in labels) + " |" for c in names] + [""])


def first_call(name: str, size: str, label: str, only: list[str] | None = None) -> float:
    """The first call's wall time of ``label`` in this process (used by ``--processes``)."""
    hw = hardware.probe()
    pipe, _ = prepare(name, size, label, hw, only=only)
    inputs = pipe.example_inputs(1, 0)
    start = time.perf_counter()
    with torch.no_grad():
        pipe.run(inputs)
    return time.perf_counter() - start


def processes(name: str, size: str, label: str, threads: int, only: list[str] | None = None) -> list[str]:
    """First-call time of ``label`` in a process with an empty inductor cache, then in a second one."""
    seconds = []
    restrict = ["--compile-only", ",".join(only)] if only is not None else []
    with tempfile.TemporaryDirectory(prefix="mixprec-inductor-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        for _ in range(2):
            out = subprocess.run([sys.executable, __file__, "--first-call", name, "--size", size, "--configs", label,
                                  "--threads", str(threads), *restrict], env=env, check=True, capture_output=True, text=True)
            seconds.append(json.loads(out.stdout.strip().splitlines()[-1])["first_call_s"])
    return [f"- {name} {label}: first call {seconds[0]:.1f} s in a process with an empty inductor cache, "
            f"{seconds[1]:.1f} s in the next process ({seconds[1] / seconds[0]:.2f}x)"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", default="tts,diffusion,minilm")
    parser.add_argument("--size", default="default")
    parser.add_argument("--configs", default=CONFIGS)
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds after the compile and warm-up round")
    parser.add_argument("--calls", type=int, default=1, help="timed calls per configuration and round (the fastest counts)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu (CPU time) or cuda (CUDA events)")
    parser.add_argument("--processes", action="store_true", help="also time the first call in a first and a second process")
    parser.add_argument("--process-config", default="fast+compile", help="the configuration --processes times")
    parser.add_argument("--components", action="store_true", help="also the CPU time of each component per configuration")
    parser.add_argument("--compile-only", metavar="COMPONENTS", default=None,
                        help="compile only these components of a compiled configuration, e.g. t3 (tts's token "
                             "decoder); the others run eager (default: every component)")
    parser.add_argument("--first-call", metavar="PIPELINE", help=argparse.SUPPRESS)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    labels = [c.strip() for c in args.configs.split(",") if c.strip()]
    only = None if args.compile_only is None else [c.strip() for c in args.compile_only.split(",") if c.strip()]
    if args.first_call:
        print(json.dumps({"first_call_s": first_call(args.first_call, args.size, labels[0], only)}))
        return 0
    hw = hardware.probe(args.device)
    lines = [f"# Compiled presets: {hw.name}, torch {torch.__version__}, mixprec {mixprec.__version__}, "
             f"{args.threads} thread(s)", "",
             f"Command: `python benchmarks/bench_compile.py {' '.join(argv if argv is not None else sys.argv[1:])}`", ""]
    for name in args.pipelines.split(","):
        lines += bench(name, args.size, labels, args.repeat, args.calls, hw, args.device, only)
        if args.components:
            lines += components(name, args.size, labels, hw, args.device, only=only)
    if args.processes:
        lines += ["## Compile time in a first and a later process", ""]
        compiled = args.process_config
        for name in args.pipelines.split(","):
            lines += processes(name, args.size, compiled, args.threads, only)
    return finish(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
