"""A real store holding one benchmark run in each state a stored run can be in (see
:mod:`mixprec.bench.runstate`), written through the :class:`~mixprec.bench.store.Store` API as the
runner writes them: an error keeps its worker's traceback, a run that never finished has no
``finish_run``, a run stored before devices were has no device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mixprec.bench.store import Store

_TRACE = "\nTraceback (most recent call last):\n  File \"worker.py\", line 1, in serve\nRuntimeError: boom"
_REF = {"sqnr_db": float("inf"), "nonfinite": 0, "weight_bytes": 4096.0}
_FAST = {"sqnr_db": 41.0, "nonfinite": 0, "weight_bytes": 2048.0}
_OK = [("fp32", [0.10, 0.11, 0.10, 0.12, 0.10], _REF, "ok", None),
       ("fast", [0.05, 0.06, 0.05, 0.05, 0.06], _FAST, "ok", None)]

#: state -> (the run's configurations (name, samples, metrics, status, error), its final status or None
#: for a run whose process never called finish_run, the machine's device)
RUNS: dict[str, tuple[list[tuple], str | None, str | None]] = {
    "complete": (_OK, "complete", "cpu"),
    "partly measured": (_OK + [("memory", [], {}, "timeout", "no answer within 30 s"),
                               ("naive-bf16", [], {}, "skipped", "not measured: the time budget left no room for it")],
                        "complete", "cpu"),
    "older record": (_OK, "complete", None),
    "no timed rounds": ([("fp32", [], _REF, "ok", None), ("fast", [], _FAST, "ok", None)], "complete", "cpu"),
    "reference failed": ([("fp32", [], {}, "failed", "RuntimeError: boom" + _TRACE),
                          ("fast", [0.05, 0.06, 0.05], _FAST, "ok", None)], "complete", "cpu"),
    "nothing measured": ([("fp32", [], {"weight_bytes": 4096.0}, "failed", "RuntimeError: boom" + _TRACE),
                          ("fast", [], {}, "timeout", None)], "complete", "cpu"),
    "interrupted": (_OK[:1] + [("fast", [0.05], _FAST, "partial", "stopped after 1 of 5 timed runs")], None, "cpu"),
    "cancelled": (_OK, "cancelled", "cpu"),
    "runner failed": (_OK, "failed", "cpu"),
    "unknown status": (_OK, "paused", "cpu"),
}


def write_run(store: Store, state: str) -> int:
    """Store the run of ``state`` (a key of :data:`RUNS`); returns its id."""
    configs, status, device = RUNS[state]
    machine: dict[str, Any] = {"name": "test cpu", **({"device": device} if device else {})}
    run_id = store.start_run(pipeline="tts", size="test", machine=machine, fingerprint="f", versions={"torch": "2"},
                             notes=[], command="mixprec bench")
    for position, (name, samples, metrics, config_status, error) in enumerate(configs):
        config_id = store.add_config(run_id, position=position, name=name, batch=1)
        for index, seconds in enumerate(samples):
            store.add_sample(config_id, index, seconds)
        store.finish_config(config_id, status=config_status, metrics=metrics, error=error)
    if status is not None:
        store.finish_run(run_id, status=status)
    return run_id


def store_of_states(path: Path) -> dict[str, int]:
    """A store at ``path`` with one run per state and a second complete run; state -> run id
    (``"complete again"``: the second complete run)."""
    with Store(path) as store:
        ids = {state: write_run(store, state) for state in RUNS}
        ids["complete again"] = write_run(store, "complete")
    return ids
