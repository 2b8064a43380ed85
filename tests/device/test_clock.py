"""The clocks decisions are timed with."""

from __future__ import annotations

import time

import pytest
import torch

from mixprec.device.clock import CpuTime, WallTime, clock_for


def test_clock_for_each_device():
    assert isinstance(clock_for("cpu"), CpuTime) and clock_for("cpu").name == "cpu-time"
    assert isinstance(clock_for("cpu", "wall"), WallTime)
    with pytest.raises(ValueError, match="clock 'sundial': choose one of cpu-time, cuda-events, wall"):
        clock_for("cpu", "sundial")
    with pytest.raises(ValueError, match="clock 'cuda-events' times CUDA work; the device is cpu"):
        clock_for("cpu", "cuda-events")


def test_cpu_time_does_not_count_a_wait(monkeypatch):
    """A call that sleeps costs wall time but (almost) no CPU time: CPU time counts what the
    process computed, which is why other jobs on the machine cannot inflate it."""
    ticks = iter([10.0, 10.25])
    monkeypatch.setattr(time, "process_time", lambda: next(ticks))
    result, seconds = CpuTime().time(lambda: "done")
    assert result == "done" and seconds == pytest.approx(0.25)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_events_time_device_work():
    clock = clock_for("cuda")
    a = torch.randn(1024, 1024, device="cuda")
    _, seconds = clock.time(lambda: a @ a)
    assert clock.name == "cuda-events" and 0 < seconds < 10
