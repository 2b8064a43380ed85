"""How the tuner measures a policy: the :class:`Evaluator` protocol,
:class:`InProcessEvaluator` (any module, in this process) and :class:`WorkerEvaluator` (a
registered pipeline in one long-lived spawned worker).
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Protocol, Sequence

from mixprec.measure.executor import WORKER_ENV  # the tune worker's environment (kept importable from here)
from mixprec.policy import Policy
from mixprec.tuning.candidates import Evaluation
from mixprec.tuning.session import Report, Session, fp8_read_units, serve_tune, weight_units

__all__ = ["Evaluator", "InProcessEvaluator", "WorkerEvaluator", "WORKER_ENV"]


class Evaluator(Protocol):
    """Measures a policy end to end.

    ``evaluate`` measures one policy; ``risk`` profiles one (weight-owning modules and
    the blocks enclosing them, riskiest first, as dicts with a ``module`` key);
    ``units`` lists the weight-owning modules; ``groups`` the rule matches the local
    search varies (component names, or ``*``); ``cache_key`` identifies target, seeds
    and repeat for a store. Optional: ``seeds`` (the search seeds) and
    ``validate(policy, seeds)`` (seed -> quality on seeds the search never used); an
    evaluator without ``validate`` cannot check the result on held-out seeds; and a
    ``progress`` attribute, which :func:`~mixprec.tuning.tuner.tune` sets for the run to a
    callback taking the events of each run (:data:`~mixprec.tuning.session.Report`).
    """

    cache_key: str

    def evaluate(self, policy: Policy) -> Evaluation: ...

    def risk(self, policy: Policy) -> list[dict[str, Any]]: ...

    def groups(self) -> list[str]: ...

    def units(self) -> list[str]: ...

    def fp8_read(self) -> dict[str, str]: ...


def _evaluation(raw: dict[str, Any]) -> Evaluation:
    per_seed = {int(seed): dict(q) for seed, q in raw.get("per_seed", {}).items()}
    return Evaluation(float(raw["latency_s"]), float(raw["memory_bytes"]), dict(raw["quality"]), per_seed)


def _fingerprint(components: dict[str, Any]) -> str:
    """A short hash of the module structure, shapes and parameter sums (tells models apart in a store)."""
    digest = hashlib.sha256()
    for cname, root in components.items():
        for name, tensor in [*root.named_parameters(), *root.named_buffers()]:
            total = float(tensor.detach().double().sum()) if tensor.is_floating_point() and not tensor.is_meta else 0.0
            digest.update(f"{cname}.{name}:{tuple(tensor.shape)}:{tensor.dtype}:{total!r};".encode())
    return digest.hexdigest()[:16]


def _groups(component_names: Sequence[str]) -> list[str]:
    return [c for c in component_names if c] or ["*"]


class InProcessEvaluator:
    """Evaluate policies in this process (synthetic models, tests, notebooks).

    Args:
        target: what :func:`mixprec.apply` takes.
        make_inputs: seed -> inputs for ``run``.
        run: inputs -> output tensor (or an object with ``.output``).
        seeds: quality is the worst case over these; latency is timed on the first.
        repeat: timed runs per evaluation (median).
        kind: output kind for :func:`mixprec.measure.metrics.quality` (``embedding``
            for ``(batch, dim)`` outputs).
        name: identifies the target in a store's cache (with a hash of its module
            structure, shapes and parameter sums).
        progress: called with the events of each run (:data:`~mixprec.tuning.session.Report`),
            the fp32 reference's included; :func:`~mixprec.tuning.tuner.tune` sets it for its run.
    """

    def __init__(self, target: Any, make_inputs: Callable[[int], Any], run: Callable[[Any], Any], *,
                 seeds: Sequence[int] = (0, 1), repeat: int = 3, kind: str = "embedding", name: str = "in-process",
                 progress: Report | None = None):
        self.target, self.repeat, self.progress = target, int(repeat), progress
        self.seeds = tuple(seeds)
        self.session = Session(target, make_inputs, run, seeds=self.seeds, kind=kind, report=progress)
        self.cache_key = f"{name}|{_fingerprint(self.session.components)}|seeds={list(self.seeds)}|repeat={self.repeat}"

    def evaluate(self, policy: Policy) -> Evaluation:
        return _evaluation(self.session.evaluate(policy, self.repeat, report=self.progress))

    def time(self, policy: Policy, repeat: int = 1) -> list[float]:
        """Seconds of ``repeat`` runs under ``policy`` on the first seed (no quality runs)."""
        return self.session.time(policy, repeat, report=self.progress)

    def risk(self, policy: Policy) -> list[dict[str, Any]]:
        return self.session.risk(policy, report=self.progress)

    def validate(self, policy: Policy, seeds: Sequence[int]) -> dict[int, dict[str, float]]:
        """Seed -> quality of ``policy`` on ``seeds`` (their fp32 references computed on first use)."""
        return self.session.qualities(policy, seeds, report=self.progress)

    def groups(self) -> list[str]:
        return _groups(list(self.session.components))

    def units(self) -> list[str]:
        return weight_units(self.session.components)

    def fp8_read(self) -> dict[str, str]:
        return fp8_read_units(self.session.components)


class ReadyWorkers:
    """What an evaluator backed by tune workers answers from their ``ready`` message, and
    held-out validation through its :meth:`_ask` of one worker."""

    ready: dict[str, Any]

    def _ask(self, command: str, payload: Any) -> Any:
        raise NotImplementedError

    def validate(self, policy: Policy, seeds: Sequence[int]) -> dict[int, dict[str, float]]:
        """Seed -> quality of ``policy`` on ``seeds`` (their fp32 references computed on first use)."""
        raw = self._ask("tune_validate", {"policy": policy.to_dict(), "seeds": [int(s) for s in seeds]})
        return {int(seed): dict(q) for seed, q in raw.items()}

    def groups(self) -> list[str]:
        return _groups(self.ready["components"])

    def units(self) -> list[str]:
        return list(self.ready["units"])

    def fp8_read(self) -> dict[str, str]:
        return dict(self.ready.get("fp8_read", {}))

    def sensitive(self) -> list[str]:
        """The pipeline's precision-sensitive module hints (for the presets)."""
        return list(self.ready.get("sensitive", []))


class WorkerEvaluator(ReadyWorkers):
    """Evaluate policies of a registered pipeline in one long-lived spawned worker.

    Args:
        pipeline_name: registered pipeline (see :func:`mixprec.pipelines.available`) or a
            factory spec ``module.path:factory`` / ``path/to/file.py:factory``.
        size: ``test`` or ``default``.
        seeds: quality seeds (teacher-forced on the fp32 reference where the
            pipeline makes discrete choices); latency is timed on the first.
        repeat: timed runs per evaluation (median).
        timeout: seconds one request may take.
        device: where the worker builds the pipeline (``cpu``, ``cuda``, ``cuda:1``; see
            :func:`mixprec.pipelines.get`); ``None``: the factory's own default. The
            store's cache keys hold the machine fingerprint, which names the device type.
        progress: called with the events of each run the worker makes
            (:data:`~mixprec.tuning.session.Report`), the fp32 reference's included.
    """

    def __init__(self, pipeline_name: str, size: str = "default", *, seeds: Sequence[int] = (0, 1), repeat: int = 3,
                 batch: int = 1, timeout: float = 600.0, threads: int | None = None, device: str | None = None,
                 progress: Report | None = None):
        from mixprec.measure.executor import LocalProcessExecutor
        from mixprec.pipelines import portable_spec

        pipeline_name = portable_spec(pipeline_name)  # a factory file path made absolute
        self.pipeline, self.size, self.seeds, self.repeat, self.timeout = pipeline_name, size, tuple(seeds), int(repeat), timeout
        self.device, self.progress = device, progress
        self.cache_key = f"{pipeline_name}|size={size}|batch={batch}|seeds={list(self.seeds)}|repeat={self.repeat}"
        job = {"name": f"tune-{pipeline_name}", "pipeline": pipeline_name, "size": size,
               "batch": batch, "threads": threads, "device": device}
        self._worker = LocalProcessExecutor().start(serve_tune, job)
        try:
            self.ready = self._worker.wait_ready(timeout)
            self._ask("tune_reference", {"seeds": list(self.seeds)})
        except BaseException:
            self.close()
            raise

    def evaluate(self, policy: Policy) -> Evaluation:
        return _evaluation(self._ask("tune_eval", {"policy": policy.to_dict(), "repeat": self.repeat}))

    def time(self, policy: Policy, repeat: int = 1) -> list[float]:
        """Seconds of ``repeat`` runs under ``policy`` on the first seed (no quality runs)."""
        return list(self._ask("tune_time", {"policy": policy.to_dict(), "repeat": repeat}))

    def risk(self, policy: Policy) -> list[dict[str, Any]]:
        return self._ask("tune_profile", {"policy": policy.to_dict()})

    def _ask(self, command: str, payload: dict[str, Any]) -> Any:
        """One request to the worker; with a ``progress`` callback, the worker reports each run to it."""
        if self.progress is None:
            return self._worker.request(command, payload, timeout=self.timeout)
        return self._worker.request(command, dict(payload, progress=True), timeout=self.timeout, on_progress=self.progress)

    def close(self) -> None:
        """Stop the worker process."""
        self._worker.close()

    def __enter__(self) -> WorkerEvaluator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
