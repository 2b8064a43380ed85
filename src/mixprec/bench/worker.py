"""Benchmark workers: one fresh process per configuration, driven over a pipe.

Global torch state and memory high-water marks cannot leak between configurations
because each one lives in its own process. Workers are started through the small
:class:`Executor` interface; :class:`LocalProcessExecutor` (spawned local processes)
is the default, and another executor (remote machines, a cluster) only needs
``start(job) -> Worker``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import traceback
from dataclasses import asdict
from typing import Any, Protocol

__all__ = ["Executor", "Worker", "LocalProcessExecutor", "WorkerError", "WorkerTimeout"]


class WorkerError(RuntimeError):
    """The worker raised or died; the message carries its error."""


class WorkerTimeout(RuntimeError):
    """The worker did not answer within its time budget."""


class Worker(Protocol):
    def request(self, command: str, payload: Any = None, *, timeout: float | None = None) -> Any: ...

    def close(self) -> None: ...


class Executor(Protocol):
    def start(self, job: dict[str, Any]) -> Worker: ...


# -- process side ------------------------------------------------------------------------


def _rss_bytes() -> int:
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset the peak-RSS counter (VmHWM)
        return True
    except OSError:
        return False


def _peak_bytes() -> int:
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _main(conn: Any, job: dict[str, Any]) -> None:  # pragma: no cover - runs in the child process
    try:
        _serve(conn, job)
    except BaseException as exc:  # report every failure to the coordinator, then exit
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"))
        except (BrokenPipeError, OSError):
            pass


def _serve(conn: Any, job: dict[str, Any]) -> None:  # pragma: no cover - runs in the child process
    # This process is ours: keep the model libraries' progress bars and advice out of
    # the benchmark's terminal output (errors still reach the coordinator).
    for name in ("TRANSFORMERS_VERBOSITY", "DIFFUSERS_VERBOSITY"):
        os.environ.setdefault(name, "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if job.get("mode") == "tune":
        # mixprec.tune's long-lived worker: tune_reference, tune_profile, tune_eval, tune_time, finish
        from mixprec._search import serve_tune

        serve_tune(conn, job)
        return
    import torch

    import mixprec
    from mixprec import pipelines
    from mixprec.bench.configs import ConfigSpec, setup
    from mixprec.hardware import Hardware

    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    hardware = Hardware.from_dict(job["hardware"]) if job.get("hardware") else None
    pipe = pipelines.get(job["pipeline"], size=job["size"], seed=job["seed"], device=job.get("device", "cpu"),
                         **job.get("overrides", {}))
    inputs = pipe.example_inputs(job["batch"], job["seed"])
    spec = ConfigSpec(**job["spec"])
    context, info = setup(spec, pipe, hardware)
    cuda = pipe.device.type == "cuda" if hasattr(pipe, "device") else False
    baseline = _rss_bytes()
    _reset_peak()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    work = getattr(pipe, "work_option", None)
    conn.send(("ready", {"weight_bytes": mixprec.weight_bytes(pipe), "policy": info["policy"], "pid": os.getpid(),
                         "output_kind": pipe.output_kind,
                         "work": (work[0], int(getattr(pipe.config, work[0])), int(work[1])) if work else None}))
    kwargs: dict[str, Any] = {}
    while True:
        command, payload = conn.recv()
        if command == "reference":
            if payload is not None:
                kwargs = {"speech_tokens": payload}
            compile_seconds = None
            if spec.compile:
                # The first call compiles: timed here, on the inputs of the timed runs, one
                # worker at a time. The peak memory reported includes it (compiling takes
                # memory the app needs too).
                start = time.perf_counter()
                with context():
                    pipe.run(inputs, **kwargs)
                if cuda:
                    torch.cuda.synchronize()
                compile_seconds = time.perf_counter() - start
            conn.send(("ok", {"compile_seconds": compile_seconds}))
        elif command == "run":
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            with context():
                out = pipe.run(inputs, **kwargs)
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            result: dict[str, Any] = {"seconds": seconds}
            if payload and payload.get("want_output"):
                result["output"] = out.output.detach().float().cpu()
                result["extras"] = {k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in out.extras().items()}
            conn.send(("ran", result))
        elif command == "finish":
            peak = (torch.cuda.max_memory_allocated() if cuda else max(0, _peak_bytes() - baseline))
            guard = info.get("guard")
            conn.send(("done", {"peak_mem_bytes": int(peak), "peak_kind": ("cuda max_memory_allocated" if cuda else "RSS above post-load baseline")
                                             + (", compiling included" if spec.compile else ""),
                                "fallbacks": len(guard.reports) if guard is not None else 0,
                                "pins": {m: p.dtype for m, p in guard.pins.items()} if guard is not None else {}}))
            return
        else:
            conn.send(("error", f"unknown command {command!r}"))


# -- coordinator side --------------------------------------------------------------------


class _ProcessWorker:
    def __init__(self, ctx: Any, job: dict[str, Any]):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_main, args=(child, job), daemon=True, name=f"mixprec-bench-{job['spec']['name']}")
        self.process.start()
        child.close()

    def _receive(self, timeout: float | None) -> Any:
        if not self.conn.poll(timeout):
            raise WorkerTimeout(f"no answer within {timeout:.0f} s")
        try:
            kind, payload = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(1)
            raise WorkerError(f"worker died without a result (exit code {self.process.exitcode}{': killed, e.g. out of memory' if (self.process.exitcode or 0) < 0 else ''})") from None
        if kind == "error":
            raise WorkerError(payload)
        return payload

    def wait_ready(self, timeout: float | None) -> Any:
        return self._receive(timeout)

    def request(self, command: str, payload: Any = None, *, timeout: float | None = None) -> Any:
        try:
            self.conn.send((command, payload))
        except (BrokenPipeError, OSError):
            raise WorkerError(f"worker died (exit code {self.process.exitcode})") from None
        return self._receive(timeout)

    def close(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()


class LocalProcessExecutor:
    """Start each worker as a fresh local process (``spawn``: no state is inherited)."""

    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")

    def start(self, job: dict[str, Any]) -> _ProcessWorker:
        return _ProcessWorker(self._ctx, job)


def portable_spec(pipeline: str) -> str:
    """``pipeline`` as another process should get it: a factory file path made absolute."""
    from mixprec.pipelines import FactoryError, normalize_spec

    try:
        return normalize_spec(pipeline)
    except FactoryError:
        return pipeline


def job_for(spec: Any, *, pipeline: str, size: str, seed: int, batch: int, hardware: Any, device: str = "cpu",
            threads: int | None = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The picklable description of one worker's job.

    A factory spec's file path is made absolute (see
    :func:`mixprec.pipelines.normalize_spec`), so the worker finds the file
    whatever its current directory; a spec that cannot be resolved is sent as
    given and the worker reports why it fails. ``overrides`` are pipeline options
    (e.g. ``{"steps": 6}``) the worker builds the pipeline with.
    """
    return {"spec": asdict(spec), "pipeline": portable_spec(pipeline), "size": size, "seed": seed, "batch": batch,
            "hardware": hardware.to_dict() if hardware is not None else None, "device": device, "threads": threads,
            "overrides": dict(overrides or {})}
