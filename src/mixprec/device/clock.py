"""Clocks that other jobs on the machine cannot bias much: what every decision is timed with.

On a shared CPU, wall-clock time measures the neighbours as much as the code: the same
matmul ran 2x to 29x fp32 in bf16 from one round to the next on a 2-core machine with two
other processes busy. CPU time counts only the cycles this process's threads ran, so two
candidates timed in CPU time compare what they compute, not when the scheduler let them
run. On a GPU, CUDA events time the kernels on the device between two points of a stream.

* :class:`CpuTime`: ``time.process_time`` (every thread of this process). Its caveat: a
  call that runs one thread where another runs two looks cheaper than its wall time says,
  and threads spinning at a barrier count; figures say which clock gave them.
* :class:`CudaEvents`: ``torch.cuda.Event(enable_timing=True)`` around the call, read
  after the end event completes (one synchronisation per timed call, outside the call).
* :class:`WallTime`: ``time.perf_counter`` with the device synchronised before and after.

:func:`clock_for` picks the clock for a device. Every clock times through
:meth:`Clock.time`, which tests replace to control what a measurement sees.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

__all__ = ["Clock", "CpuTime", "CudaEvents", "WallTime", "clock_for", "one_thread", "CLOCKS"]

#: The clock names :func:`clock_for` accepts.
CLOCKS = ("cpu-time", "cuda-events", "wall")


class Clock:
    """Times one call: :meth:`time` returns ``(result, seconds)``."""

    #: How the figures it gives are labelled (``cpu-time``, ``cuda-events``, ``wall``).
    name = "clock"

    def time(self, call: Callable[[], Any]) -> tuple[Any, float]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class CpuTime(Clock):
    """CPU seconds of this process (all its threads) spent in the call."""

    name = "cpu-time"

    def time(self, call: Callable[[], Any]) -> tuple[Any, float]:
        start = time.process_time()
        result = call()
        return result, time.process_time() - start


class WallTime(Clock):
    """Wall seconds of the call, ``device`` synchronised before and after (so a GPU's queued kernels count)."""

    name = "wall"

    def __init__(self, device: torch.device | str | None = None):
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    def time(self, call: Callable[[], Any]) -> tuple[Any, float]:
        self._sync()
        start = time.perf_counter()
        result = call()
        self._sync()
        return result, time.perf_counter() - start


class CudaEvents(Clock):
    """Device seconds between two CUDA events recorded on the current stream around the call."""

    name = "cuda-events"

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)

    def time(self, call: Callable[[], Any]) -> tuple[Any, float]:
        with torch.cuda.device(self.device):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = call()
            end.record()
            end.synchronize()
            return result, start.elapsed_time(end) / 1000.0


def clock_for(device: torch.device | str | None, kind: str | None = None) -> Clock:
    """The clock for timing work on ``device``: CPU time on a CPU, CUDA events on a GPU, wall
    time on MPS; ``kind`` (one of :data:`CLOCKS`) chooses another.

    Raises:
        ValueError: an unknown ``kind``, or ``cuda-events`` for a device that is not CUDA.
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if kind is None:
        kind = {"cpu": "cpu-time", "cuda": "cuda-events"}.get(dev.type, "wall")
    if kind not in CLOCKS:
        raise ValueError(f"clock {kind!r}: choose one of {', '.join(CLOCKS)}")
    if kind == "cuda-events":
        if dev.type != "cuda":
            raise ValueError(f"clock 'cuda-events' times CUDA work; the device is {dev}: choose cpu-time or wall")
        return CudaEvents(dev)
    return CpuTime() if kind == "cpu-time" else WallTime(dev)


@contextmanager
def one_thread(dev: torch.device) -> Iterator[None]:
    """On a CPU, one intra-op thread inside the block (restored after it), for timing where
    other processes must not move the figures. The probe times so: CPU time of one thread is what it
    computes, whatever else runs (with two, a thread spinning at a barrier while its partner
    waits for a core counts too: bf16 read 3.5x to 44x fp32 under two CPU hogs on a 2-core
    Xeon; on one thread 6.9x to 7.3x, as quiet). Ratios, not absolute rates, decide."""
    threads = torch.get_num_threads()
    if dev.type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
