"""Measured evaluations to find the keep-fp32 set: per-layer prior vs the hierarchical prior.

Three synthetic models of 64 residual blocks (``tests/tune_models.py``), 3 of them
sensitive to bf16 weights: per layer (one layer's own error is large), per block (only
the block's output is wrong: two layers whose difference is amplified), and both. For
each, the same bound is searched two ways on the same evaluator:

- ``per-layer prior``: the former search: the weight-owning layers ranked by their own
  error, then adaptive group testing over that flat list;
- ``hierarchical``: :func:`mixprec.tune` as it is: the module tree ranked by every
  node's own error, searched top down.

Each run counts measured evaluations (the fp32 baseline and the all-16-bit starts
included, local search off) and checks the chosen keep set on 10 fresh seeds.

Usage:
    python benchmarks/bench_tune_evals.py [--bound sqnr>=40] [--out benchmarks/results/tune_evals.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tune_models import inputs, model  # noqa: E402

from mixprec import hardware  # noqa: E402
from mixprec.tuning.bounds import parse_bound, tightened, worst_case  # noqa: E402
from mixprec.tuning.candidates import Config  # noqa: E402
from mixprec.tuning.evaluators import InProcessEvaluator  # noqa: E402
from mixprec.tuning.group_testing import minimal_sufficient  # noqa: E402
from mixprec.tuning.search import Search  # noqa: E402
from mixprec.tuning.tuner import tune  # noqa: E402

FRESH = tuple(range(100, 110))


def per_layer_prior(ev: InProcessEvaluator, bound, start: Config) -> tuple[list[str], int]:
    """The former search from ``start``: layers by own error, flat group testing."""
    search = Search(ev, bound, "memory", None, None, None, "bench")
    search.evaluate(Config("fp32"), "baseline fp32")
    search.evaluate(start, "start")
    rows = [r for r in ev.risk(start.policy()) if r["unit"]]
    order = [r["module"] for r in rows]

    def suffices(keep: frozenset[str]) -> bool:
        return search.evaluate(dataclasses.replace(start, keep=tuple(u for u in order if u in keep)), "bisect").met

    keep = minimal_sufficient(order, suffices) or []
    return keep, search.measured + 1  # + the other all-16-bit start tune measures too


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bound", default="sqnr>=40")
    parser.add_argument("--out", default="benchmarks/results/tune_evals.md")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    bound = parse_bound(args.bound)
    hw = hardware.probe()
    lines = [
        "# Evaluations to find the keep-fp32 set: per-layer prior vs hierarchical", "",
        f"Command: `{' '.join(['python benchmarks/bench_tune_evals.py', *(argv if argv is not None else sys.argv[1:])])}`",
        "",
        f"Machine: {hw.name}, CPU flags {' '.join(hw.cpu_flags) or 'n/a'}, torch {hw.torch_version}. "
        "Evaluation counts do not depend on the machine's speed.",
        f"Bound `{bound}` (searched as `{tightened(bound, 1.0)}`: 1 dB margin), objective memory, 16-bit types "
        "bf16 (native) and fp16 storage with fp32 compute, the search starting from the one closer to the bound; "
        "search seeds 0 and 1; 64 blocks, 3 sensitive (7, 30, 51).", "",
        "| sensitivity shows | search | start | measured evaluations | kept fp32 | worst sqnr on 10 fresh seeds |",
        "|---|---|---|---:|---|---:|",
    ]
    for kind in ("layer", "block", "both"):
        net = model(kind)
        ev = InProcessEvaluator(net, inputs, net, seeds=(0, 1), repeat=1, name=f"bench-{kind}")
        result = tune(kind, bound, evaluator=ev, objective="memory", dtypes=("bf16",), local_search=False,
                      hardware=hw)
        start = Config(result.policy.rules[0].storage, compute=result.policy.rules[0].compute)
        flat_keep, flat_n = per_layer_prior(ev, tightened(bound, 1.0), start)
        flat_policy = dataclasses.replace(start, keep=tuple(flat_keep)).policy()
        for label, n, keep, policy in (("per-layer prior", flat_n, flat_keep, flat_policy),
                                       ("hierarchical", result.evaluations, result.keep_fp32, result.policy)):
            fresh = worst_case(list(ev.validate(policy, FRESH).values()))["sqnr_db"]
            where = f"{start.base} storage" + (f", {start.compute} compute" if start.compute else "")
            lines.append(f"| per {kind if kind != 'both' else 'layer and per block'} | {label} | {where} | {n} | "
                         f"{', '.join(sorted(keep)) or 'none'} | {fresh:.1f} |")
            print(lines[-1], flush=True)
    lines += ["", "Limits held by tests/tuning/test_tune.py: at most 20 evaluations per block and for both, 16 per layer.", ""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
