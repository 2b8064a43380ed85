"""The benchmark worker's warm-up on a GPU: until the run time stops falling (a scripted clock)."""

from __future__ import annotations

from mixprec.bench.worker import settle


class ScriptedClock:
    """Each run takes the next duration of ``durations``; reading the clock costs nothing."""

    def __init__(self, durations):
        self.durations, self.now, self.runs = list(durations), 0.0, 0

    def __call__(self) -> float:
        return self.now

    def run(self) -> None:
        self.now += self.durations[self.runs]
        self.runs += 1


def test_warm_up_goes_on_while_runs_get_faster_and_stops_once_two_are_no_faster():
    clock = ScriptedClock([5.0, 3.0, 2.0, 1.5, 1.49, 1.52, 1.0])  # clocks ramp, allocator grows, then steady
    assert settle(clock.run, clock=clock) == 6 and clock.runs == 6


def test_warm_up_is_bounded_in_runs_and_in_time():
    falling = ScriptedClock([10.0 * 0.9 ** i for i in range(50)])
    assert settle(falling.run, clock=falling, most=12, limit_s=1000.0) == 12
    slow = ScriptedClock([20.0] * 10)
    assert settle(slow.run, clock=slow, limit_s=30.0) == 2  # a second run starts before 30 s, a third would not
