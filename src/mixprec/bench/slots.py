"""One configuration's worker in a benchmark run: its state (:class:`Slot`), and each request
to it kept within the configuration's time limit and, with a budget, the run's deadline.

A request that the worker fails or that outruns the configuration's own limit marks the
configuration ``failed`` or ``timeout`` (:func:`fail`); one stopped by the budget's deadline
marks it ``skipped`` (never timed) or ``partial`` (:func:`stop_for_budget`), with the reason.
Every second a request takes is charged to the configuration (``Slot.spent``), on the clock
the caller passes, so a scripted clock drives the limits in tests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from mixprec.bench.configs import ConfigSpec
from mixprec.measure.executor import WorkerCancelled, WorkerError, WorkerTimeout

__all__ = ["LOAD_TIMEOUT_S", "Slot", "call", "fail", "stop_for_budget", "wait_ready"]

#: Seconds a worker may take to load its model.
LOAD_TIMEOUT_S = 600.0


@dataclass
class Slot:
    """One configuration of a batch size in a run: its worker, status and what it measured."""

    spec: ConfigSpec
    config_id: int
    worker: Any = None
    status: str = "running"
    error: str | None = None
    spent: float = 0.0
    samples: list[float] = field(default_factory=list)
    ready: dict[str, Any] = field(default_factory=dict)
    first: dict[str, Any] | None = None
    done: dict[str, Any] = field(default_factory=dict)
    compile_s: float | None = None
    #: The share of the compiled graphs that inductor loaded from torch's on-disk cache.
    compile_cached: float | None = None
    rounds: list[int] = field(default_factory=list)  # the timed round of each sample
    fallbacks: int = 0
    untimed: int = 0  # timed rounds left out because a guard fallback ran in them
    last_s: float | None = None  # seconds of its last run, warm-ups included

    @property
    def alive(self) -> bool:
        return self.status == "running"


def fail(slot: Slot, exc: BaseException) -> None:
    """Mark ``slot`` ``timeout`` (its own limit) or ``failed`` (the worker raised or died) and stop its worker;
    a worker stopped because the run was cancelled (Ctrl-C) leaves it ``partial``: cut short, not failed."""
    if isinstance(exc, WorkerCancelled):
        slot.status, slot.error = "partial", f"stopped after {len(slot.samples)} timed run(s): {exc}"
    else:
        slot.status = "timeout" if isinstance(exc, WorkerTimeout) else "failed"
        slot.error = str(exc) if not isinstance(exc, WorkerTimeout) else f"exceeded the {slot.spent:.0f} s time limit ({exc})"
    if slot.worker is not None:
        slot.worker.close()


def stop_for_budget(slot: Slot, why: str) -> None:
    """Stop ``slot`` for the budget: ``skipped`` (not measured) without a timed run, else ``partial``."""
    slot.status = "partial" if slot.samples else "skipped"
    slot.error = why if slot.samples else f"not measured: {why}"
    if slot.worker is not None:
        slot.worker.close()


def call(slot: Slot, timeout: float, command: str, payload: Any = None, *,
         clock: Callable[[], float] = time.monotonic, until: float | None = None) -> Any:
    """One request to ``slot``'s worker within its time limit and, with ``until``, the budget's."""
    start = clock()
    allowed = max(0.001, timeout - slot.spent)
    by_budget = until is not None and until - start < allowed
    if by_budget:
        allowed = max(0.001, until - start)
    try:
        return slot.worker.request(command, payload, timeout=allowed)
    except (WorkerError, WorkerTimeout) as exc:
        slot.spent += clock() - start
        if by_budget and isinstance(exc, WorkerTimeout):
            stop_for_budget(slot, f"stopped at the time budget, {clock() - start:.0f} s into its {command} call")
        else:
            fail(slot, exc)
        return None
    finally:
        if slot.alive:
            slot.spent += clock() - start


def wait_ready(slot: Slot, clock: Callable[[], float] = time.perf_counter, until: float | None = None) -> float:
    """Wait for the worker's model (with ``until``: no later than that); returns the seconds it took."""
    start = clock()
    allowed = LOAD_TIMEOUT_S if until is None else max(0.0, min(LOAD_TIMEOUT_S, until - start))
    if allowed <= 0:
        stop_for_budget(slot, "still loading when the time budget ran out")
        return 0.0
    try:
        slot.ready = slot.worker.wait_ready(allowed)
    except WorkerTimeout as exc:
        if allowed < LOAD_TIMEOUT_S:
            stop_for_budget(slot, f"still loading when the time budget ran out ({clock() - start:.0f} s)")
        else:
            fail(slot, exc)
    except WorkerError as exc:
        fail(slot, exc)
    return clock() - start
