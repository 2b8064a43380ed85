"""Benchmark runs written into a real store with synthetic samples, the timing source compare and the gate read.

Each configuration is ``(name, samples, metrics)`` or ``(name, samples, metrics, status)``;
``samples`` are the seconds of timed rounds 0, 1, ... or a ``{round: seconds}`` dict (a
round left out, as when a guard fallback ran in it).
"""

from __future__ import annotations

import math
import random
from typing import Any, Sequence


def store_run(store: Any, configs: Sequence[tuple], *, pipeline: str = "tts", size: str = "test",
              status: str = "complete", fingerprint: str = "f", batch: int = 1, device: str | None = None) -> int:
    """``device``: stored with the machine, as the runner stores it (``None``: a run stored before devices were)."""
    machine = {"name": "test cpu", **({"device": device} if device else {})}
    run_id = store.start_run(pipeline=pipeline, size=size, machine=machine, fingerprint=fingerprint,
                             versions={}, notes=[])
    for position, spec in enumerate(configs):
        name, samples, metrics = spec[:3]
        config_status = spec[3] if len(spec) > 3 else "ok"
        cid = store.add_config(run_id, position=position, name=name, batch=batch)
        rounds = samples.items() if isinstance(samples, dict) else enumerate(samples)
        for index, seconds in rounds:
            store.add_sample(cid, index, seconds)
        store.finish_config(cid, status=config_status, metrics=metrics)
    store.finish_run(run_id, status=status)
    return run_id


def machine_load(rounds: int, *, seed: int = 0, low: float = 1.0, high: float = 3.0) -> list[float]:
    """How much slower than quiet each round ran on a busy machine (random, reproducible)."""
    rng = random.Random(seed)
    return [math.exp(rng.uniform(math.log(low), math.log(high))) for _ in range(rounds)]


def jitter(values: Sequence[float], spread: float, *, seed: int = 1) -> list[float]:
    """``values`` each moved by up to ``spread`` (a fraction) either way."""
    rng = random.Random(seed)
    return [v * (1 + rng.uniform(-spread, spread)) for v in values]
