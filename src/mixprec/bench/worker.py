"""The benchmark's side of a worker process: load one configuration, time its runs,
report its peak memory. Started through :mod:`mixprec.measure.executor`.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import asdict
from types import SimpleNamespace
from typing import Any, Callable

import torch

from mixprec import pipelines
from mixprec.bench.configs import ConfigSpec, setup
from mixprec.casting.targets import weight_bytes
from mixprec.device.hardware import Hardware
from mixprec.measure.memory import peak_bytes, reset_peak, rss_bytes
from mixprec.pipelines import portable_spec
from mixprec.policy.select import UnmatchedRuleWarning

__all__ = ["serve", "job_for", "reference_output", "settle"]

#: A GPU has settled when this many runs in a row are no more than :data:`SETTLED` faster than the best.
CALM_RUNS = 2
SETTLED = 0.03


def settle(run: Callable[[], Any], *, clock: Callable[[], float] = time.perf_counter, most: int = 12,
           limit_s: float = 30.0) -> int:
    """Warm up until a run's time stops falling; returns the runs made.

    On a GPU the first calls ramp the clocks up, grow the caching allocator and let cuDNN
    pick its kernels, each for a different number of calls: a fixed count of warm-up runs
    can leave any of them in the timings. ``run`` must include its own synchronisation.
    """
    best, calm, made = float("inf"), 0, 0
    began = clock()
    while made < most and clock() - began < limit_s:
        start = clock()
        run()
        seconds = clock() - start
        made += 1
        calm = 0 if seconds < best * (1 - SETTLED) else calm + 1
        best = min(best, seconds)
        if calm >= CALM_RUNS:
            break
    return made


def reference_output(payload: dict[str, Any]) -> SimpleNamespace:
    """The fp32 reference run's output as a worker gets it (``{"output", "extras"}``): an
    object with ``.output`` and each extra as an attribute, what ``Pipeline.teacher_forced`` reads."""
    return SimpleNamespace(**payload.get("extras", {}), output=payload.get("output"))


def serve(conn: Any, job: dict[str, Any]) -> None:  # pragma: no cover - runs in the child process
    """Load the job's pipeline under its configuration, then answer ``reference`` / ``run`` / ``finish``."""
    # A policy's rules that match no module are said once, before the run and in its notes
    # (configs.unmatched_notes): not again by this process, wherever it applies the policy
    # (set-up, the guard's fallback re-applying it), as a Python warning with a source path.
    warnings.filterwarnings("ignore", category=UnmatchedRuleWarning)
    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    hardware = Hardware.from_dict(job["hardware"]) if job.get("hardware") else None
    pipe = pipelines.get(job["pipeline"], size=job["size"], seed=job["seed"], device=job.get("device", "cpu"),
                         **job.get("overrides", {}))
    inputs = pipe.example_inputs(job["batch"], job["seed"])
    spec = ConfigSpec(**job["spec"])
    context, info = setup(spec, pipe, hardware, inputs)
    cuda = pipe.device.type == "cuda" if hasattr(pipe, "device") else False
    baseline = rss_bytes()
    reset_peak()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    settled = 0  # warm-up runs made until a GPU's run time stopped falling (before the first run)
    work = getattr(pipe, "work_option", None)
    conn.send(("ready", {"weight_bytes": weight_bytes(pipe), "policy": info["policy"], "pid": os.getpid(),
                         "load_cpu_s": time.process_time(),  # CPU seconds of starting and loading, for the budget plan
                         "output_kind": pipe.output_kind,
                         "work": (work[0], int(getattr(pipe.config, work[0])), int(work[1])) if work else None}))
    while True:
        command, payload = conn.recv()
        if command == "reference":
            if payload is not None:
                # Teacher forcing: the runs replay the fp32 run's choices (speech tokens, latents).
                inputs = pipe.teacher_forced(inputs, reference_output(payload))
            compile_seconds = cached = None
            if spec.compile:
                graphs_before = _inductor_cache_counts()
                # The first call compiles: timed here, on the inputs of the timed runs, one
                # worker at a time. The peak memory reported includes it (compiling takes
                # memory the app needs too).
                start = time.perf_counter()
                with context():
                    pipe.run(inputs)
                if cuda:
                    torch.cuda.synchronize()
                compile_seconds = time.perf_counter() - start
                hits, misses = (after - before for after, before in zip(_inductor_cache_counts(), graphs_before))
                cached = hits / (hits + misses) if hits + misses else None
            conn.send(("ok", {"compile_seconds": compile_seconds, "compile_cached": cached}))
        elif command == "run":
            if cuda and not settled:
                def once() -> None:
                    with context():
                        pipe.run(inputs)
                    torch.cuda.synchronize()

                settled = settle(once)
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            with context():
                out = pipe.run(inputs)
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            guard = info.get("guard")
            result: dict[str, Any] = {"seconds": seconds, "fallbacks": len(guard.reports) if guard is not None else 0}
            if payload and payload.get("want_output"):
                result["output"] = out.output.detach().float().cpu()
                result["extras"] = {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in out.extras().items()}
            conn.send(("ran", result))
        elif command == "finish":
            peak = (torch.cuda.max_memory_allocated() if cuda else max(0, peak_bytes() - baseline))
            guard = info.get("guard")
            conn.send(("done", {"peak_mem_bytes": int(peak), "weight_bytes": weight_bytes(pipe), "peak_kind": ("cuda max_memory_allocated" if cuda else "RSS above post-load baseline")
                                             + (", compiling included" if spec.compile else ""),
                                "fallbacks": len(guard.reports) if guard is not None else 0,
                                "pins": {m: p.dtype for m, p in guard.pins.items()} if guard is not None else {}}))
            return
        else:
            conn.send(("error", f"unknown command {command!r}"))


def job_for(spec: Any, *, pipeline: str, size: str, seed: int, batch: int, hardware: Any, device: str = "cpu",
            threads: int | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The picklable description of one worker's job.

    A factory spec's file path is made absolute (see
    :func:`mixprec.pipelines.normalize_spec`), so the worker finds the file
    whatever its current directory; a spec that cannot be resolved is sent as
    given and the worker reports why it fails. ``overrides`` are pipeline options
    (e.g. ``{"steps": 6}``) the worker builds the pipeline with.
    """
    return {"name": f"bench-{spec.name}", "spec": asdict(spec), "pipeline": portable_spec(pipeline), "size": size, "seed": seed, "batch": batch,
            "hardware": hardware.to_dict() if hardware is not None else None, "device": device, "threads": threads,
            "overrides": dict(overrides or {})}


def _inductor_cache_counts() -> tuple[int, int]:
    """Inductor's FX-graph cache hits and misses so far in this process: graphs a compile
    loaded from torch's on-disk cache (an earlier process compiled them) or generated."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["fxgraph_cache_hit"]), int(counters["inductor"]["fxgraph_cache_miss"])
