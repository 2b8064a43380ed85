"""The oracle a per-component calibration is held to: every combination of per-component dtypes, run whole.

For each reference pipeline: one fp32 run records each component's share of the time
(:class:`mixprec.calibration.record.Recorder`). Every combination of fp32 / bf16 / fp16 (the
16-bit types the probe finds native) over the components that take at least ``--min-share``
of the run is then built as a policy (one rule per component; the components below it
follow the largest component's dtype), with the whole-model candidates beside them (the
rules, the one-line casts) and the calibrated presets (``mixprec.calibrate``, measured now,
nothing remembered). Each is checked once against fp32's output (teacher-forced), then all
are timed whole in paired, interleaved rounds on the device clock (CPU time on a CPU, CUDA
events on a GPU): round ``i`` runs every policy once, in alternating order.

The report gives, per preset floor, the fastest combination that meets it (the best any
precision decision could do on this machine for this pipeline) and the calibrated preset's
paired speed against it.

Usage:
    HF_HUB_OFFLINE=1 python benchmarks/calibration_oracle.py --pipelines tts,diffusion --size default \
        [--rounds 3] [--presets fast,balanced] [--out benchmarks/results/calibration-oracle-<machine>.md]
"""

from __future__ import annotations

import itertools
import os
import platform
import statistics
import sys
import time
import warnings

import torch

import mixprec
from mixprec import pipelines
from mixprec.calibration import FLOORS_DB, calibrate
from mixprec.calibration.candidates import candidates
from mixprec.calibration.record import Recorder
from mixprec.calibration.trials import detached, device_of, output_quality
from mixprec.casting.targets import components_of
from mixprec.device.clock import clock_for
from mixprec.device.hardware import probe
from mixprec.measure.stats import paired_ratio
from mixprec.policy import Policy, Rule
from mixprec.policy.presets import native16
from mixprec.policy.select import UnmatchedRuleWarning

from _report import db_text, pipeline_parser


def _machine() -> str:
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = " ".join(sorted(f for f in ("avx512_bf16", "amx_bf16", "avx512_fp16") if f in probe("cpu").cpu_flags))
    return f"{name} ({flags or 'avx2 only'}), {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


def _combinations(names: list[str], followers: list[str], largest: str, dtypes: list[str]) -> dict[str, Policy]:
    out = {}
    for combo in itertools.product(["fp32", *dtypes], repeat=len(names)):
        if all(d == "fp32" for d in combo):
            continue
        chosen = dict(zip(names, combo))
        for f in followers:
            chosen[f] = chosen[largest]
        label = " ".join(f"{c}={chosen[c]}" for c in names)
        out[label] = Policy(tuple(Rule(c, storage=d, optional=True) for c, d in chosen.items() if d != "fp32"), name="oracle")
    return out


def _pipeline(name: str, size: str, device: str, rounds: int, presets: list[str], min_share: float) -> list[str]:
    pipe = pipelines.get(name, size=size, seed=0, device=device)
    dev = device_of(pipe.components)
    clock = clock_for(dev)
    hw = probe(dev)
    inputs = pipe.example_inputs(1, 0)
    recorder = Recorder(pipe.components, clock)
    with recorder, torch.inference_mode():
        reference = pipe.run(inputs)
    forced = pipe.teacher_forced(inputs, reference)
    ref = detached(reference)
    seconds = {c: r.seconds for c, r in recorder.records.items()}
    total = sum(seconds.values()) or 1.0
    timed = [c for c in pipe.components if seconds[c] / total >= min_share]
    largest = max(seconds, key=seconds.get)
    followers = [c for c in pipe.components if c not in timed]
    dtypes = sorted(native16(hw))
    policies: dict[str, Policy | None] = {"fp32": None}
    policies.update(_combinations(timed, followers, largest, dtypes))
    hints = components_of(pipe)[1]
    for cand in candidates("fast", hw, hints):
        if cand.policy is not None and cand.label in ("rules", *(f"naive-{d}" for d in dtypes)):
            policies[f"whole: fast {cand.label}" if cand.label == "rules" else f"whole: {cand.label}"] = cand.policy
    calibrated = {}
    for preset in presets:
        start = time.monotonic()
        result = calibrate(pipe, preset, cache=False)
        calibrated[preset] = (result, time.monotonic() - start)
        policies[f"calibrated {preset}"] = result.policy

    quality: dict[str, float] = {}
    for label, policy in policies.items():
        if policy is None:
            quality[label] = float("inf")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnmatchedRuleWarning)
            with mixprec.apply(pipe, policy), torch.inference_mode():
                quality[label], _ = output_quality(detached(pipe.run(forced)), ref)
                pipe.run(forced)  # warm in this policy

    times: dict[str, list[float]] = {label: [] for label in policies}
    order = list(policies)
    for index in range(rounds):
        for label in (order if index % 2 == 0 else order[::-1]):
            policy = policies[label]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UnmatchedRuleWarning)
                applied = mixprec.apply(pipe, policy) if policy is not None else None
                try:
                    with torch.inference_mode():
                        _, took = clock.time(lambda: pipe.run(forced))
                finally:
                    if applied is not None:
                        applied.revert()
            times[label].append(took)

    speed = {label: paired_ratio(times["fp32"], times[label]) for label in policies if label != "fp32"}
    lines = [f"## {name} ({size}, batch 1) on {device}", "",
             f"fp32 run: {statistics.median(times['fp32']):.3f} s ({clock.name}, median of {rounds}); components: " +
             ", ".join(f"{c} {seconds[c] / total:.0%}" for c in pipe.components) +
             (f"; below {min_share:.0%} and following {largest}'s dtype: {', '.join(followers)}" if followers else ""), "",
             "| policy | speed vs fp32 (paired, 95% interval) | output SQNR vs fp32 |", "|---|---|---|"]
    for label in sorted(speed, key=lambda l: -speed[l].value):
        q = quality[label]
        lines.append(f"| {label} | {speed[label].text()} | {db_text(q)} |")
    lines.append("")
    for preset, (result, took) in calibrated.items():
        floor = FLOORS_DB[preset]
        meets = [l for l in speed if not l.startswith("calibrated") and quality[l] >= floor]
        best = max(meets, key=lambda l: speed[l].value) if meets else None
        if best is None or speed[best].value < 1.0:  # nothing beats fp32 itself
            best = "fp32"
        label = f"calibrated {preset}"
        against = paired_ratio(times[best], times[label])
        lines.append(f"- **{preset}** (floor {floor:g} dB): calibrated in {took:.1f} s to `{result.chosen}` "
                     f"({'decided' if result.decided else 'undecided'}; {result.headline()}); "
                     f"end to end {db_text(quality[label])}, {speed[label].text()} fp32. "
                     + f"Oracle's fastest qualifying: `{best}`"
                     + (f" at {speed[best].text()} fp32" if best != "fp32" else "")
                     + f"; the calibrated preset runs at **{against.text()}** its speed.")
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = pipeline_parser(__doc__.splitlines()[0])
    parser.add_argument("--presets", default="fast,balanced")
    parser.add_argument("--min-share", type=float, default=0.01)
    args = parser.parse_args(argv)
    machine = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else _machine()
    lines = [f"# The calibration's oracle: every per-component combination, run whole ({machine})", "",
             f"$ HF_HUB_OFFLINE=1 python benchmarks/calibration_oracle.py {' '.join(argv if argv is not None else sys.argv[1:])}",
             "", f"torch {torch.__version__}, Python {platform.python_version()}; "
             f"{time.strftime('%Y-%m-%d', time.gmtime())}", ""]
    for name in [p.strip() for p in args.pipelines.split(",") if p.strip()]:
        lines += _pipeline(name, args.size, args.device, args.rounds,
                           [p.strip() for p in args.presets.split(",") if p.strip()], args.min_share)
        print("\n".join(lines[-40:]), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
