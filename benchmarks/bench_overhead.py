"""What mixprec costs over a naive 16-bit cast, and what it gains over fp32, on the reference pipelines.

Every configuration runs the same pipeline object on the same inputs in one process:
fp32, the naive casts (every component ``.to(bfloat16)`` / ``.half()``, set up by
``mixprec.bench.configs.setup`` as ``mixprec bench`` does) and the presets (applied with
``mixprec.apply``). tts is teacher-forced on the fp32 run's speech tokens, so every
configuration does the same work. Round 0 is an untimed warm-up; then, in interleaved
rounds whose order reverses every other round (A-B-B-A), each configuration is set up,
timed on ``--calls`` calls (the fastest counts for the round) and reverted: a preset by
``Applied.revert``, a naive cast by putting the fp32 tensors themselves back, so fp32
stays bit-exact (checked at the end). Ratios are paired per round
(:func:`mixprec.measure.stats.paired_ratio`): speed-up = fp32 time / configuration time,
and the same against the faster naive cast of that round.

After its warm-up calls (as many as an applied model takes to decide which per-module
casts it keeps), each configuration runs once more under ``sys.setprofile``,
counting the Python function calls whose code lies in the mixprec package, except the
reference pipelines' own code (``mixprec/pipelines``): the Python work mixprec adds per
run. Quality is the SQNR of the warm-up output against the fp32 output; memory is the bytes of
the weights as the configuration stores them (``mixprec.weight_bytes``), against fp32's.
``--configs`` also takes ``quality`` and ``autocast-bf16`` / ``autocast-fp16``
(``torch.autocast`` around each run): with ``--configs
fp32,autocast-bf16,quality,balanced,fast,memory`` this is every preset against fp32 and autocast.

A ``+calibrated`` preset (``fast+calibrated``) is first checked on the pipeline by
:func:`mixprec.calibrate` (its candidates timed on the same inputs, within
``--calibration-limit`` seconds; a remembered decision is reused unless ``--fresh``), then
applied like any preset; its decision is listed under the table. Calls are timed with the
device's clock (``--clock``; default CPU time on a CPU, CUDA events on a GPU), and the
last column compares each configuration with the fastest of fp32 and the naive casts in
the same round.

Usage:
    HF_HUB_OFFLINE=1 python benchmarks/bench_overhead.py [--pipelines tts,diffusion,minilm] [--sizes test,default]
        [--batches 1] [--repeat 5] [--calls 3] [--configs fp32,naive-bf16,naive-fp16,balanced,fast,memory]
        [--device cpu] [--clock cpu-time|wall] [--calibration-limit 20] [--fresh] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections import Counter

import torch
from _report import finish, speedup

import mixprec
from mixprec import hardware, pipelines
from mixprec.bench import configs
from mixprec.device import clock as mixprec_clock
from mixprec.measure.metrics import sqnr_db

CONFIGS = "fp32,naive-bf16,naive-fp16,balanced,fast,memory"
KINDS = ("baseline", "naive", "autocast", "preset")  # the ones this script can revert in place
PACKAGE = os.path.dirname(os.path.abspath(mixprec.__file__)) + os.sep
WORKLOAD = os.path.join(PACKAGE, "pipelines") + os.sep
#: Calls before the counted one: an applied model decides its per-module casts in its first calls.
STEADY = 4


@contextlib.contextmanager
def configured(spec: configs.ConfigSpec, pipe, hw: hardware.Hardware, calibrated: dict | None = None):
    """``pipe`` set up as ``spec`` says inside the block, back to its fp32 self (bit-exact) after it
    (a ``+calibrated`` preset applies ``calibrated[spec.name].policy``)."""
    if spec.kind == "preset":
        policy = (calibrated[spec.name].policy if spec.calibrated
                  else mixprec.preset(spec.arg, hardware=hw, hints=tuple(pipe.sensitive)))
        applied = mixprec.apply(pipe, policy)
        try:
            yield
        finally:
            applied.revert()
        return
    # .to(dtype) gives parameters new data and modules new buffers: keep the old ones to put back.
    saved = [(store, name, tensor, tensor.data) for component in pipe.components.values() for module in component.modules()
             for store in (module._parameters, module._buffers) for name, tensor in store.items() if tensor is not None]
    context, _ = configs.setup(spec, pipe, hw)
    try:
        with context():
            yield
    finally:
        for store, name, tensor, data in saved:
            store[name] = tensor
            tensor.data = data


def python_calls(run) -> Counter:
    """Python function calls during ``run()`` into mixprec (``"mixprec"``) and into the reference pipelines (``"pipeline"``)."""
    counts: Counter = Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            counts["pipeline" if frame.f_code.co_filename.startswith(WORKLOAD) else "mixprec"] += 1

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return counts


def bench(name: str, size: str, specs: list, repeat: int, calls: int, hw: hardware.Hardware, device: str, *,
          batch: int = 1, clock=None, calibration_limit: float = 20.0, fresh: bool = False) -> list[str]:
    """The markdown table of one pipeline at one size and batch."""
    pipe = pipelines.get(name, size=size, seed=0, device=device)
    inputs = pipe.example_inputs(batch, 0)
    clock = clock or mixprec_clock.clock_for(device)
    calibrated, took = {}, {}
    for spec in specs:
        if spec.calibrated:
            start = time.monotonic()
            calibrated[spec.name] = mixprec.calibrate(pipe, spec.arg, inputs, hardware=hw, time_limit=calibration_limit,
                                                      cache="refresh" if fresh else True)
            took[spec.name] = time.monotonic() - start
    reference = pipe.run(inputs)
    kwargs = {"speech_tokens": reference.speech_tokens} if name == "tts" else {}
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)

    def run():
        output = pipe.run(inputs, **kwargs)
        sync()  # a GPU's time is the kernels', not their launches'
        return output

    times: dict[str, list[float]] = {spec.name: [] for spec in specs}
    quality: dict[str, float] = {}
    weights: dict[str, int] = {}
    counts: dict[str, Counter] = {}
    for round_index in range(repeat + 1):  # round 0: warm-up, quality and the counted run
        for spec in (specs if round_index % 2 else specs[::-1]):
            with configured(spec, pipe, hw, calibrated):
                if round_index == 0:
                    quality[spec.name] = sqnr_db(run().output, reference.output)
                    weights[spec.name] = mixprec.weight_bytes(pipe)
                    for _ in range(STEADY):
                        run()
                    counts[spec.name] = python_calls(run)
                    continue
                times[spec.name].append(min(clock.time(run)[1] for _ in range(calls)))
    exact = torch.equal(run().output, reference.output)

    naive = [times[n] for n in ("naive-bf16", "naive-fp16") if n in times]
    best_naive = [min(round_times) for round_times in zip(*naive)] if naive else None
    # The fastest of fp32 and the naive casts by median, paired round by round with each configuration
    # (a per-round minimum of several would pick whichever was lucky in that round: biased low).
    fastest = min(["fp32", *(n for n in ("naive-bf16", "naive-fp16") if n in times)], key=lambda n: statistics.median(times[n]))
    best_plain = times[fastest]
    lines = [f"### {name}, size={size}, batch {batch}", "",
             f"| config | median ms ({clock.name}) | speed-up vs fp32 (interval) | vs best naive (interval) "
             f"| vs the fastest of fp32 and naive ({fastest}) | SQNR vs fp32 (dB) | weight bytes vs fp32 | mixprec Python calls per run |",
             "|---|---|---|---|---|---|---|---|"]
    for spec in specs:
        t = times[spec.name]
        lines.append(f"| {spec.name} | {statistics.median(t) * 1e3:.1f} | "
                     f"{'reference' if spec.name == 'fp32' else speedup(times['fp32'], t)} | "
                     f"{speedup(best_naive, t) if best_naive else '-'} | {speedup(best_plain, t)} | "
                     f"{quality[spec.name]:.1f} | {weights[spec.name] / weights['fp32']:.3f} | {counts[spec.name]['mixprec']} |")
    for label, result in calibrated.items():
        lines.append(f"- {label}: kept **{result.chosen}** ({result.source}, {took[label]:.1f} s): {result.headline()}")
    lines += ["", f"Not counted: the pipeline's own code in mixprec/pipelines, {counts['fp32']['pipeline']} calls per fp32 run. "
              f"fp32 after every configuration was applied and reverted: {'bit-exact' if exact else 'NOT bit-exact'} "
              "against the first run.", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", default="tts,diffusion,minilm")
    parser.add_argument("--sizes", default="test,default")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds after the warm-up round")
    parser.add_argument("--calls", type=int, default=3, help="timed calls per configuration and round (the fastest counts)")
    parser.add_argument("--configs", default=CONFIGS, help="fp32 (required: the reference), naive-bf16/fp16, "
                        "autocast-bf16/fp16, presets (quality, balanced, fast, memory; +calibrated)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batches", default="1", help="batch sizes, e.g. 1,16")
    parser.add_argument("--clock", default=None, help="cpu-time | cuda-events | wall (default: the device's)")
    parser.add_argument("--calibration-limit", type=float, default=20.0, help="seconds each +calibrated preset may take")
    parser.add_argument("--fresh", action="store_true", help="calibrate again even where a decision is remembered")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    hw = hardware.probe(args.device)
    specs, notes = configs.parse_configs(args.configs, hw)
    unsupported = [s.name for s in specs if s.kind not in KINDS or s.compile]
    if unsupported:
        parser.error(f"cannot measure {', '.join(unsupported)} here (global settings, policy files and compiled "
                     "configurations are not reverted in place); use mixprec bench")
    lines = [
        f"$ HF_HUB_OFFLINE=1 python benchmarks/bench_overhead.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip(),
        "",
        f"device: {hw.device_type} ({hw.name}; CPU flags: {', '.join(hw.cpu_flags) or 'none of avx512*/amx*'}), "
        f"{hw.threads} threads, torch {torch.__version__}; probe: "
        + ", ".join(f"{d} {hw.dtypes[d].klass} ({hardware.ratio_text(hw.dtypes[d].ratio, hw.dtypes[d].klass)})"
                    for d in ("bf16", "fp16")),
        f"clock: {mixprec_clock.clock_for(args.device, args.clock).name}; batch {args.batches}; {args.repeat} interleaved A-B-B-A rounds after a warm-up round; per round, the fastest of {args.calls} "
        "calls; ratios paired per round (median, 95 % bootstrap interval, or the range below 5 rounds): speed-up = "
        "fp32 time / its time, 'vs best naive' = the faster naive cast's time / its time; a figure only where the "
        "interval lies wholly above 1 (faster) or below 1 (slower), else 'undecided' with the interval, or 'undecided "
        "(n=2)' below 3 rounds",
        *notes,
        "",
    ]
    clock = mixprec_clock.clock_for(args.device, args.clock)
    for name in args.pipelines.split(","):
        for size in args.sizes.split(","):
            for batch in [int(b) for b in args.batches.split(",")]:
                table = bench(name.strip(), size.strip(), specs, args.repeat, args.calls, hw, args.device, batch=batch,
                              clock=clock, calibration_limit=args.calibration_limit, fresh=args.fresh)
                print("\n".join(table), flush=True)
                lines += table
    return finish(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
