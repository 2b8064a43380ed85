"""Measuring one target in one process: :class:`Session` keeps the fp32 references of its seeds
and measures a policy's quality, latency, weight bytes and risk profile.

It serves :class:`~mixprec.tuning.evaluators.InProcessEvaluator` directly, and inside a
spawned worker :func:`serve_tune` answers a
:class:`~mixprec.tuning.evaluators.WorkerEvaluator` (through
:mod:`mixprec.measure.executor`).

Every method that runs the target takes a ``report`` callback, called with a
:data:`Report` event (a dict: ``phase``, ``done``, ``total``, ``unit``) when its work
begins and after each run, so a long evaluation says how far it is; in the worker the
events travel to the caller as ``progress`` messages before the answer.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Sequence, Iterator

import torch

from mixprec.casting.apply import apply
from mixprec.casting.targets import components_of
from mixprec.diagnose.profile import profile
from mixprec.measure import metrics as bench_metrics
from mixprec.policy import Policy
from mixprec.tuning.bounds import worst_case
from mixprec.tuning.candidates import Config

__all__ = ["Report", "Session", "weight_units", "risk_key", "serve_tune"]

#: Called with ``{"phase": str | None, "done": int, "total": int, "unit": str}``: work begun (``done`` 0) or a step done.
Report = Callable[[dict[str, Any]], None]


class _Runs:
    """Counts the runs of one request for ``report``: an event when the work begins, then one per run."""

    def __init__(self, report: Report | None, total: int, phase: str | None = None):
        self.report, self.total, self.phase, self.done = report, total, phase, 0
        self._send()

    def _send(self) -> None:
        if self.report is not None:
            self.report({"phase": self.phase, "done": self.done, "total": self.total, "unit": "runs"})

    def __call__(self) -> None:
        self.done += 1
        self._send()


def weight_units(components: dict[str, torch.nn.Module]) -> list[str]:
    """Qualified names of the modules that own floating-point parameters directly."""
    names = []
    for cname, root in components.items():
        for name, module in root.named_modules():
            if any(p is not None and p.is_floating_point() for p in module._parameters.values()):
                names.append(((f"{cname}.{name}" if name else cname) if cname else name) or "")
    return names


def _named_modules(components: dict[str, torch.nn.Module]) -> Iterator[tuple[str, torch.nn.Module]]:
    for cname, root in components.items():
        for name, module in root.named_modules():
            yield ((f"{cname}.{name}" if name else cname) if cname else name) or "(root)", module


def fp8_read_units(components: dict[str, torch.nn.Module]) -> dict[str, str]:
    """Modules whose weight an fp8 policy keeps in 16 bits because code reads it (qualified
    name -> where), :func:`mixprec.casting.fp8.dtype_read_weights`: the search may still
    try them in fp8 by naming them, and keeps that only where the bound holds."""
    from mixprec.casting.fp8plan import dtype_read_weights, fp8_eligible

    read = dtype_read_weights(components)
    out: dict[str, str] = {}
    for cname, root in components.items():
        for name, module in root.named_modules():
            weight = module._parameters.get("weight")
            if weight is not None and id(weight) in read and fp8_eligible(module, "p:weight", weight):
                out[((f"{cname}.{name}" if name else cname) if cname else name) or ""] = read[id(weight)]
    return out


def _output(result: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    if isinstance(result, torch.Tensor):
        return result, {}
    tensor = getattr(result, "output", None)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"run must return a tensor or an object with an .output tensor, got {type(result).__name__}")
    extras = result.extras() if hasattr(result, "extras") else {}
    return tensor, extras


class Session:
    """Measure policies on one target against fp32 references computed once.

    Args:
        target: what :func:`mixprec.apply` takes (module, mapping or pipeline).
        make_inputs: seed -> inputs for ``run``.
        run: inputs -> output (tensor, or an object with ``.output``).
        seeds: the seeds quality is measured on; latency uses the first.
        kind: output kind for :func:`mixprec.measure.metrics.quality`.
        teacher_force: optional ``(inputs, reference_output) -> inputs`` replaying the
            reference's discrete choices.
    """

    def __init__(self, target: Any, make_inputs: Callable[[int], Any], run: Callable[[Any], Any], *,
                 seeds: Sequence[int], kind: str = "embedding",
                 teacher_force: Callable[[Any, Any], Any] | None = None, sample_rate: int | None = None,
                 report: Report | None = None):
        if not seeds:
            raise ValueError("seeds must name at least one seed, got an empty sequence")
        self.target, self.run, self.kind, self.sample_rate = target, run, kind, sample_rate
        self.make_inputs, self.teacher_force = make_inputs, teacher_force
        self.seeds = tuple(int(s) for s in seeds)
        self.inputs: dict[int, Any] = {}
        self.references: dict[int, torch.Tensor] = {}
        # Per-step predictions of the fp32 runs (a diffusion pipeline's noise predictions), compared step by step.
        self.reference_steps: dict[int, torch.Tensor] = {}
        self._sync = _synchronizer(self.components)
        self._reference(self.seeds, _Runs(report, len(set(self.seeds)), "fp32 reference"))

    def _reference(self, seeds: Sequence[int], ran: Callable[[], None] = lambda: None) -> None:
        """Run fp32 on the seeds not seen yet: their inputs and reference outputs (``ran`` after each run)."""
        with torch.inference_mode():
            for seed in seeds:
                if seed in self.references:
                    continue
                inputs = self.make_inputs(seed)
                try:
                    result = self.run(inputs)
                except Exception as exc:  # nothing can be measured against a reference that does not run
                    text = " ".join(str(exc).split())[:300]
                    raise ValueError(f"the fp32 reference failed on seed {seed} ({type(exc).__name__}: {text}): nothing "
                                     "was measured") from exc
                tensor, extras = _output(result)
                self.references[seed] = tensor.detach().float().cpu().clone()
                steps = extras.get("noise_predictions")
                if isinstance(steps, torch.Tensor):
                    self.reference_steps[seed] = steps.detach().float().cpu().clone()
                self.inputs[seed] = self.teacher_force(inputs, result) if self.teacher_force is not None else inputs
                ran()

    @property
    def components(self) -> dict[str, torch.nn.Module]:
        return components_of(self.target)[0]

    def _quality(self, seed: int) -> dict[str, float]:
        result = self.run(self.inputs[seed])
        tensor, extras = _output(result)
        quality = bench_metrics.quality(tensor.detach().float().cpu(), self.references[seed], self.kind,
                                        sample_rate=self.sample_rate)
        if extras.get("token_agreement") is not None:
            quality["token_agreement"] = float(extras["token_agreement"])
        steps, ref_steps = extras.get("noise_predictions"), self.reference_steps.get(seed)
        if isinstance(steps, torch.Tensor) and ref_steps is not None and steps.shape == ref_steps.shape:
            quality.update(bench_metrics.step_quality(steps.detach().float().cpu(), ref_steps))
        return {k: float(v) for k, v in quality.items() if v is not None}

    def evaluate(self, policy: Policy, repeat: int, *, paired: bool = False, report: Report | None = None) -> dict[str, Any]:
        """Apply ``policy``, measure quality on every seed and ``repeat`` timed runs, revert.

        ``paired``: first time ``repeat`` fp32 runs in this process, right before, and
        return their median as ``fp32_latency_s``: workers on different nodes, or sharing
        one, each compare a candidate with fp32 timed beside it.
        """
        repeat = max(1, repeat)
        ran = _Runs(report, (repeat if paired else 0) + len(self.seeds) + repeat)
        fp32 = self._time(Config("fp32").policy("fp32"), repeat, ran) if paired else None
        with apply(self.target, policy) as applied, torch.inference_mode():
            per_seed = {}
            for seed in self.seeds:  # the first run warms up
                per_seed[seed] = self._quality(seed)
                ran()
            samples = self._timed(repeat, ran)
            memory = applied.weight_bytes()
        out = {"latency_s": statistics.median(samples), "samples": samples, "memory_bytes": float(memory),
               "quality": worst_case(list(per_seed.values())), "per_seed": per_seed}
        if fp32 is not None:
            out["fp32_latency_s"] = statistics.median(fp32)
        return out

    def qualities(self, policy: Policy, seeds: Sequence[int], *, report: Report | None = None) -> dict[int, dict[str, float]]:
        """Quality of ``policy`` on each of ``seeds`` (fp32 references computed for new seeds first)."""
        seeds = [int(s) for s in seeds]
        ran = _Runs(report, len({s for s in seeds if s not in self.references}) + len(seeds))
        self._reference(seeds, ran)
        out = {}
        with apply(self.target, policy), torch.inference_mode():
            for seed in seeds:
                out[seed] = self._quality(seed)
                ran()
        return out

    def time(self, policy: Policy, repeat: int = 1, *, report: Report | None = None) -> list[float]:
        """Seconds of ``repeat`` runs under ``policy`` on the first seed (no quality runs).

        A compiled policy first makes one untimed call, which compiles.
        """
        repeat = max(1, repeat)
        return self._time(policy, repeat, _Runs(report, repeat + (policy.compile is not None)))

    def _time(self, policy: Policy, repeat: int, ran: Callable[[], None]) -> list[float]:
        with apply(self.target, policy), torch.inference_mode():
            if policy.compile is not None:
                self.run(self.inputs[self.seeds[0]])
                ran()
            return self._timed(repeat, ran)

    def _timed(self, repeat: int, ran: Callable[[], None] = lambda: None) -> list[float]:
        """Seconds of ``repeat`` runs on the first seed; on a GPU, until its kernels have run (not only been launched)."""
        samples = []
        for _ in range(max(1, repeat)):
            self._sync()
            start = time.perf_counter()
            self.run(self.inputs[self.seeds[0]])
            self._sync()
            samples.append(time.perf_counter() - start)
            ran()
        return samples

    def risk(self, policy: Policy, *, report: Report | None = None) -> list[dict[str, Any]]:
        """Every module holding weights under ``policy``, riskiest first (from :func:`mixprec.profile`).

        Rows cover the weight-owning layers (``unit`` true) and every block and
        component enclosing one, each with its own error: the prior of the
        hierarchical search (:func:`hierarchical_keep`).
        """
        units = set(weight_units(self.components))
        enclosing = {unit.rsplit(".", k)[0] for unit in units for k in range(1, unit.count(".") + 1)}
        def passes(event: Any) -> None:  # the profile's passes, in module calls
            if report is not None:
                report({"phase": event.phase, "done": event.done, "total": event.total, "unit": event.unit})

        prof = profile(self.target, self.inputs[self.seeds[0]], policy, run=self.run,
                       progress=passes if report is not None else None)
        rows = []
        sizes = {name: sum(p.numel() for p in module.parameters(recurse=False) if p.is_floating_point())
                 for name, module in _named_modules(self.components)}
        for stats in prof.modules:
            if stats.module not in units and stats.module not in enclosing:
                continue
            own = stats.own_sqnr_db if stats.own_sqnr_db is not None else math.inf
            rows.append({"module": stats.module, "own_sqnr_db": own, "overflows_fp16": bool(stats.overflows_fp16),
                         "own_nonfinite": bool(stats.own_nonfinite), "unit": stats.module in units,
                         "elements": sizes.get(stats.module, 0)})
        rows.sort(key=risk_key)
        return rows


def _synchronizer(components: dict[str, torch.nn.Module]) -> Callable[[], None]:
    """Waits for the CUDA devices the components' weights live on (nothing to wait for on a CPU)."""
    cuda = sorted({t.device for m in components.values() for t in [*m.parameters(), *m.buffers()] if t.device.type == "cuda"},
                  key=str)
    if not cuda:
        return lambda: None

    def sync() -> None:
        for device in cuda:
            torch.cuda.synchronize(device)

    return sync


def risk_key(row: dict[str, Any]) -> tuple[bool, float]:
    """Riskiest first: overflow or inf/NaN, then the lowest own SQNR."""
    own = row["own_sqnr_db"]
    return (not (row["overflows_fp16"] or row["own_nonfinite"]), own if not math.isnan(own) else -math.inf)


def serve_tune(conn: Any, job: dict[str, Any]) -> None:  # pragma: no cover - runs in the worker process
    """Serve ``tune_reference`` / ``tune_profile`` / ``tune_eval`` / ``tune_time`` / ``tune_validate`` / ``finish``."""
    import warnings

    from mixprec import pipelines
    from mixprec.policy.select import UnmatchedRuleWarning

    # A user policy's rules that match no module are said once by the tuner, before the search
    # and in the result's notes: not by each worker as a Python warning with a source path.
    warnings.filterwarnings("ignore", category=UnmatchedRuleWarning)
    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    pipe = pipelines.get(job["pipeline"], size=job["size"], seed=0, device=job.get("device"))
    batch = int(job.get("batch", 1))
    conn.send(("ready", {"output_kind": pipe.output_kind, "components": list(pipe.components), "device": str(pipe.device),
                         "sensitive": [str(h) for h in pipe.sensitive],
                         "units": weight_units(pipe.components), "fp8_read": fp8_read_units(pipe.components),
                         "pid": __import__("os").getpid()}))
    session: Session | None = None
    while True:
        command, payload = conn.recv()
        # asked for: each run of the request is reported as a ("progress", event) message before its answer
        report = (lambda event: conn.send(("progress", event))) if isinstance(payload, dict) and payload.get("progress") else None
        if command == "tune_reference":
            start = time.perf_counter()
            session = Session(pipe, lambda seed: pipe.example_inputs(batch, seed), pipe.run, seeds=payload["seeds"],
                              kind=pipe.output_kind, teacher_force=pipe.teacher_forced, sample_rate=pipe.sample_rate,
                              report=report)
            conn.send(("ok", {"seconds": time.perf_counter() - start}))
        elif command in ("tune_eval", "tune_profile", "tune_time", "tune_validate") and session is None:
            conn.send(("error", f"{command} before tune_reference"))
        elif command == "tune_eval":
            conn.send(("ok", session.evaluate(Policy.from_dict(payload["policy"]), int(payload.get("repeat", 3)),
                                              paired=bool(payload.get("paired")), report=report)))
        elif command == "tune_time":
            conn.send(("ok", session.time(Policy.from_dict(payload["policy"]), int(payload.get("repeat", 1)), report=report)))
        elif command == "tune_profile":
            conn.send(("ok", session.risk(Policy.from_dict(payload["policy"]), report=report)))
        elif command == "tune_validate":
            conn.send(("ok", session.qualities(Policy.from_dict(payload["policy"]), payload["seeds"], report=report)))
        elif command == "finish":
            conn.send(("done", {}))
            return
        else:
            conn.send(("error", f"unknown command {command!r}; valid: tune_reference, tune_eval, tune_time, tune_profile, tune_validate, finish"))
