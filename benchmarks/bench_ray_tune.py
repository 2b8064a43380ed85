"""Wall time of ``mixprec tune`` on minilm: the local tuner (one worker process) against
``--executor ray --workers 2`` on a Ray head started on this machine, and whether both
choose the same policy.

Usage:
    .venv/bin/python benchmarks/bench_ray_tune.py [--size test|default] [--rounds 2] [--out FILE.md]

Each round runs both commands one after the other (alternating which goes first), each
with a fresh store, so no measurement is reused. The Ray head (``ray start --head
--num-cpus N --resources '{"mixprec-hw:local": 1}'``) is started once before the rounds
and stopped after them; its start-up is reported apart. Writes a Markdown table with
both wall times, the chosen policies, the command lines, and the CPU model and flags
from /proc/cpuinfo.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIXPREC = str(Path(sys.executable).with_name("mixprec"))
RAY = str(Path(sys.executable).with_name("ray"))
PORT = 6391


def cpuinfo() -> tuple[str, list[str]]:
    model, flags = platform.processor() or "?", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("?", ""):
                model = value.strip()
            elif key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value.split()
    except OSError:
        pass
    return model, flags


def tune(args: list[str], db: Path) -> tuple[float, dict]:
    command = [MIXPREC, "tune", *args, "--db", str(db), "--json"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, json.loads(done.stdout)


def policy_text(result: dict) -> str:
    policy = dict(result["policy"])
    rules = [{k: v for k, v in r.items() if k != "reason"} for r in policy.get("rules", [])]
    return json.dumps({"rules": rules, "numerics": policy.get("numerics"), "compile": policy.get("compile")}, sort_keys=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="test")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bound", default="sqnr>=30")
    parser.add_argument("--objective", default="latency", choices=["latency", "memory"])
    parser.add_argument("--extra", default="", help="more mixprec tune flags for both runs, e.g. '--seeds 4 --repeat 5'")
    parser.add_argument("--out", default=None)
    options = parser.parse_args()
    # the head and the tune commands agree on Ray's token authentication (on where ~/.ray/auth_token exists)
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    cores = len(os.sched_getaffinity(0))
    common = ["--pipeline", "minilm", "--size", options.size, "--bound", options.bound, "--objective", options.objective,
              *options.extra.split()]
    ray_args = [*common, "--executor", "ray", "--ray-address", f"127.0.0.1:{PORT}", "--workers", "2", "--worker-cpus",
                str(max(1, cores // 2))]
    started = time.perf_counter()
    subprocess.run([RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(PORT), "--num-cpus", str(cores),
                    "--resources", json.dumps({"mixprec-hw:local": 1}), "--include-dashboard", "false", "--disable-usage-stats"],
                   check=True, capture_output=True)
    head_s = time.perf_counter() - started
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for index in range(options.rounds):
                order = [("local", common), ("ray", ray_args)]
                if index % 2:
                    order.reverse()
                for name, args in order:
                    wall, result = tune(args, Path(tmp) / f"{name}-{index}.sqlite")
                    rows.append({"round": index, "executor": name, "wall_s": wall, "tune_wall_s": result["wall_s"],
                                 "evaluations": result["evaluations"], "met": result["met"], "policy": policy_text(result),
                                 "notes": result["notes"]})
                    print(f"round {index} {name}: {wall:.1f} s, {result['evaluations']} evaluations", flush=True)
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True)
    model, flags = cpuinfo()
    local = [r["wall_s"] for r in rows if r["executor"] == "local"]
    remote = [r["wall_s"] for r in rows if r["executor"] == "ray"]
    same = len({r["policy"] for r in rows}) == 1
    lines = [f"## mixprec tune on minilm ({options.size}, objective {options.objective}): local vs Ray with 2 workers", "",
             f"- CPU: {model}, {cores} cores available to this process (shared with other work while measured)",
             f"- CPU flags: `{' '.join(flags)}`",
             f"- Python {platform.python_version()}; produced by `benchmarks/bench_ray_tune.py --size {options.size} "
             f"--objective {options.objective} --rounds {options.rounds}"
             + (f" --extra '{options.extra}'" if options.extra else "") + "`",
             f"- local: `mixprec tune {' '.join(common)}`",
             f"- ray: `mixprec tune {' '.join(ray_args)}` against `ray start --head --num-cpus {cores}` on this machine "
             f"(head start-up {head_s:.1f} s, not counted below)", "",
             "| round | executor | wall s (command) | wall s (tune) | evaluations | bound met |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['round']} | {r['executor']} | {r['wall_s']:.1f} | {r['tune_wall_s']:.1f} | {r['evaluations']} | {r['met']} |"
              for r in rows]
    lines += ["", f"Median wall time: local {statistics.median(local):.1f} s, ray {statistics.median(remote):.1f} s "
              f"({statistics.median(local) / statistics.median(remote):.2f}x).", "",
              f"Same policy chosen in every run: {'yes' if same else 'no'}.", ""]
    for policy in dict.fromkeys(r["policy"] for r in rows):
        who = ", ".join(f"{r['executor']} #{r['round']}" for r in rows if r["policy"] == policy)
        lines.append(f"- {who}: `{policy}`")
    lines += ["", "Notes of the ray runs:", ""]
    lines += [f"- round {r['round']}: " + "; ".join(r["notes"]) for r in rows if r["executor"] == "ray"]
    text = "\n".join(lines) + "\n"
    print(text)
    if options.out:
        Path(options.out).write_text(text)


if __name__ == "__main__":
    main()
