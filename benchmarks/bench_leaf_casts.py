"""Overhead of the per-layer input casts (``LeafCast``) or of the app-code entries
(``AppEntry``) on the reference pipelines.

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

``--wrappers meet`` measures the rule for where dtypes meet (:class:`DtypeMeet`, a
``try`` around each entry method of every mixed component) the same way, under
``--policy``, in the state every model is in until an op refuses its inputs.

``--wrappers app`` measures the rule for where a component's own methods (app code)
meet module outputs instead: under ``--policy`` (a preset, default ``fast``), the same
applied model runs with and without every ``AppEntry`` (the forward wrappers on blocks
and the hooks on modules' own methods), interleaved the same way. Each round gives one
with/without ratio; the table shows their median and range.

Usage:
    HF_HUB_OFFLINE=1 python benchmarks/bench_leaf_casts.py [--wrappers leaf|app|meet] [--size default] [--repeat 5] [--out FILE]
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
from mixprec.casting.hooks import AppEntry, LeafCast, MethodHookHandle, add_method_hook
from mixprec.casting.meet import DtypeMeet
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


class _AppEntries:
    """Every AppEntry (or, with ``kind=DtypeMeet``, every DtypeMeet) of an applied model,
    switched off and on together."""

    def __init__(self, handles: list, kind: type = AppEntry) -> None:
        self.forwards = [h for h in handles if isinstance(h, kind)]
        self.methods = [h for h in handles if isinstance(h, MethodHookHandle) and isinstance(
            getattr(h.entry[2], "__self__", None), kind)]

    def __len__(self) -> int:
        return len(self.forwards) + len(self.methods)

    def set(self, on: bool) -> None:
        for entry in self.forwards:
            entry.install(entry.module) if on else entry.remove()
        for i, handle in enumerate(self.methods):
            if on:
                self.methods[i] = add_method_hook(handle.module, handle.name, handle.entry[2], priority=-handle.entry[0])
            else:
                handle.remove()


class _LeafCasts:
    def __init__(self, handles: list) -> None:
        self.casts = [h for h in handles if isinstance(h, LeafCast)]

    def __len__(self) -> int:
        return len(self.casts)

    def set(self, on: bool) -> None:
        for cast in self.casts:
            cast.install(cast.module) if on else cast.remove()


def bench(name: str, size: str, repeat: int, wrappers: str = "leaf", preset: str = "fast"):
    """(median without, median with, per-round ratios, wrappers installed, leaf-cast checks per run or None)."""
    pipe = pipelines.get(name, size=size, seed=0)
    inputs = pipe.example_inputs(1, 0)
    if wrappers == "leaf":
        marks = tuple(Rule(name, storage="bf16", compute="fp32") for name in _first_layers(pipe))
        policy = Policy((Rule("*", storage="fp32"), *marks), name="mixed-fp32")
    else:
        policy = mixprec.preset(preset)
    applied = mixprec.apply(pipe, policy)
    switch = (_LeafCasts(applied._handles) if wrappers == "leaf"
              else _AppEntries(applied._handles, DtypeMeet if wrappers == "meet" else AppEntry))
    times: dict[str, list[float]] = {"without": [], "with": []}
    for round_index in range(repeat + 1):
        for mode in (("without", "with") if round_index % 2 else ("with", "without")):
            switch.set(mode == "with")
            start = time.perf_counter()
            pipe.run(inputs)
            elapsed = time.perf_counter() - start
            if round_index:
                times[mode].append(elapsed)
    switch.set(True)
    ratios = [w / wo for w, wo in zip(times["with"], times["without"])]
    calls = None
    if wrappers == "leaf":  # one counted run: how many leaf-cast checks a pipeline run makes
        calls = 0
        for cast in switch.casts:
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
    return statistics.median(times["without"]), statistics.median(times["with"]), ratios, len(switch), calls


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
    parser.add_argument("--wrappers", choices=("leaf", "app", "meet"), default="leaf")
    parser.add_argument("--policy", default="fast", help="with --wrappers app or meet: the preset applied")
    parser.add_argument("--size", default="default")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    hw = hardware.probe()
    what = {"leaf": "leaf casts", "app": f"app entries (preset {args.policy})",
            "meet": f"dtype-meet hooks (preset {args.policy})"}[args.wrappers]
    lines = [
        f"$ HF_HUB_OFFLINE=1 python benchmarks/bench_leaf_casts.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip(),
        "",
        f"device: {hw.device_type} ({hw.name}; CPU flags: {', '.join(hw.cpu_flags) or 'none of avx512*/amx*'}), "
        f"{hw.threads} threads, torch {torch.__version__}; batch 1, size={args.size}, "
        f"{args.repeat} interleaved rounds after one warm-up (x20 for minilm)",
        "",
        f"| pipeline | {what} installed | checks per run | without (s) | with (s) | with / without, median of rounds (min-max) "
        "| cost of the checks |",
        "|---|---|---|---|---|---|---|",
    ]
    cost = per_call_cost() if args.wrappers == "leaf" else None
    for name in args.pipelines.split(","):
        repeat = args.repeat * (20 if name.strip() == "minilm" else 1)  # short runs: more rounds
        without, with_, ratios, installed, calls = bench(name.strip(), args.size, repeat, args.wrappers, args.policy)
        share = f"{100 * calls * cost / without:.2f}%" if calls is not None else "-"
        lines.append(f"| {name} | {installed} | {calls if calls is not None else '-'} | {without:.4f} | {with_:.4f} | "
                     f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | {share} |")
        print(lines[-1], flush=True)
    if cost is not None:
        lines += ["", f"One check, input already in the right dtype: {cost * 1e6:.2f} µs (fastest of 7 interleaved rounds of "
                  "2,000 calls of a small Linear, with and without the wrapper). 'cost of the checks' = checks per run x "
                  "that cost / the run's median time: the overhead itself; the ratio also holds the machine's noise."]
    return finish(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
