from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixprec.bench.evidence import (
    FASTER,
    MIN_PAIRS,
    SLOWER,
    UNDECIDED,
    WITHIN_NOISE,
    Interval,
    change,
    latency,
    reference,
    regression,
    speedup,
    speedup_cell,
)


def _config(name, samples, metrics=None, rounds=None, batch=1):
    out = {"name": name, "batch": batch, "status": "ok", "samples": list(samples), "metrics": metrics or {}}
    if rounds is not None:
        out["rounds"] = list(rounds)
    return out


def test_speedup_pairs_samples_by_round_not_by_position():
    fp32 = _config("fp32", [1.0, 9.0, 1.0, 1.0, 1.0, 1.0])
    # Round 1 of the configuration was not timed (a guard fallback ran in it).
    fast = _config("fast", [0.5] * 5, rounds=[0, 2, 3, 4, 5])
    ratio = speedup({"configs": [fp32, fast]}, fast)
    assert (ratio.value, ratio.low, ratio.high, ratio.n) == (2.0, 2.0, 2.0, 5)


def test_speedup_prefers_the_stored_paired_interval():
    fp32 = _config("fp32", [1.0] * 6)
    fast = _config("fast", [0.5] * 6, {"speedup": 1.8, "speedup_ci_low": 1.7, "speedup_ci_high": 1.95,
                                      "speedup_pairs": 6})
    assert speedup({"configs": [fp32, fast]}, fast) == Interval(1.8, 1.7, 1.95, 6, True)


def test_a_speedup_without_samples_or_interval_decides_nothing():
    fast = _config("fast", [], {"speedup": 1.8})
    alone = speedup({"configs": [_config("fp32", []), fast]}, fast)
    assert alone.n == 0 and not alone.usable and alone.text() == "1.80x (no interval)"
    assert change(alone, Interval(3.0, 2.9, 3.1, 10)) == UNDECIDED
    assert speedup({"configs": [_config("fp32", []), _config("x", [])]}, _config("x", [])) is None


def test_reference_is_fp32_of_the_same_batch():
    run = {"configs": [_config("fast", [1.0]), _config("fp32", [2.0]), _config("fp32", [3.0], batch=4),
                       _config("fast", [1.0], batch=4)]}
    assert reference(run, 1)["samples"] == [2.0] and reference(run, 4)["samples"] == [3.0]
    assert reference({"configs": [_config("memory", [1.0])]}, 1)["name"] == "memory"  # no fp32: the first
    assert reference(run, 8) is None


def test_latency_from_samples_when_no_interval_was_stored():
    one = latency(_config("fp32", [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.02], {"latency_median": 1.0}))
    assert one.value == 1.0 and one.low < 1.0 < one.high and one.n == 7 and one.usable
    single = latency(_config("fp32", [1.0]))
    assert single.n == 1 and not single.usable  # one sample: no noise to speak of
    assert latency(_config("fp32", [])) is None


@pytest.mark.parametrize(("before", "after", "expected"), [
    (Interval(1.0, 0.98, 1.02, 8), Interval(1.2, 1.18, 1.22, 8), SLOWER),
    (Interval(1.0, 0.98, 1.02, 8), Interval(0.8, 0.78, 0.82, 8), FASTER),
    (Interval(1.0, 0.98, 1.02, 8), Interval(1.01, 0.99, 1.03, 8), WITHIN_NOISE),
    (Interval(1.0, 0.5, 2.0, 8), Interval(1.3, 1.2, 1.4, 8), UNDECIDED),  # overlapping, one too wide
    (Interval(1.0, 1.0, 1.0, 1), Interval(2.0, 2.0, 2.0, 1), UNDECIDED),  # single samples
    (Interval(1.0, 0.98, 1.02, None), Interval(1.2, 1.18, 1.22, None), SLOWER),  # stored intervals, no samples
])
def test_change(before, after, expected):
    assert change(before, after) == expected
    assert change(None, after) is None


def test_regression_of_latency_and_of_speedup():
    base = Interval(1.0, 0.98, 1.02, 8)
    assert regression(base, Interval(1.2, 1.15, 1.25, 8), 0.10, higher_is_slower=True) == "regression"
    assert regression(base, Interval(1.05, 1.04, 1.06, 8), 0.10, higher_is_slower=True) == "ok"
    assert regression(base, Interval(1.1, 0.9, 1.4, 8), 0.10, higher_is_slower=True) == "undecided"
    fast = Interval(2.0, 1.95, 2.05, 8)
    assert regression(fast, Interval(1.5, 1.45, 1.55, 8), 0.10, higher_is_slower=False) == "regression"
    assert regression(fast, Interval(1.9, 1.88, 1.92, 8), 0.10, higher_is_slower=False) == "ok"
    assert regression(fast, Interval(1.7, 1.2, 2.6, 8), 0.10, higher_is_slower=False) == "undecided"
    assert regression(fast, None, 0.10, higher_is_slower=False) is None
    assert regression(fast, Interval(math.nan, math.nan, math.nan, 8), 0.1, higher_is_slower=False) == "undecided"


class TestSpeedupCell:
    """The one rendering of a speed-up in every table: a ratio alone only where its interval supports it."""

    @pytest.mark.parametrize(("interval", "unstable", "shown"), [
        (Interval(1.42, 1.31, 1.55, 8), False, "1.42x (1.31–1.55)"),
        (Interval(0.61, 0.55, 0.70, 8), False, "0.61x (0.55–0.70)"),  # supported slower
        (Interval(0.98, 0.90, 1.07, 8), False, "undecided (0.90–1.07)"),
        (Interval(2.92, 2.92, 2.92, 1, False), False, "undecided (n=1)"),  # one sample: no interval
        (Interval(12.17, 11.0, 13.0, 2, False), False, "undecided (n=2)"),
        (Interval(1.8, 1.8, 1.8, 0, False), False, "undecided (no interval)"),
        (Interval(math.nan, math.nan, math.nan, 8), False, "—"),
        (Interval(1.5, 1.2, math.inf, 8), False, "undecided (no interval)"),
        (Interval(1.42, 1.31, 1.55, 8), True, "unstable (1.31–1.55)"),
        (Interval(0.068, 0.061, 0.074, 6), False, "0.068x (0.061–0.074)"),
        (Interval(1.42, 1.31, 1.55, None), False, "1.42x (1.31–1.55)"),  # stored without a pair count
    ])
    def test_each_case(self, interval, unstable, shown):
        assert speedup_cell(interval, unstable=unstable) == shown

    def test_reference_and_nothing(self):
        assert speedup_cell(Interval(1.0, 1.0, 1.0, 6), reference=True) == "reference"
        assert speedup_cell(None) == "—"

    @given(value=st.floats(0.01, 100), low_f=st.floats(0.3, 1.0), high_f=st.floats(1.0, 3.0),
           n=st.one_of(st.none(), st.integers(0, 50)), unstable=st.booleans())
    @settings(max_examples=300, deadline=None)
    def test_a_ratio_reads_as_a_result_only_where_the_interval_supports_it(self, value, low_f, high_f, n, unstable):
        interval = Interval(value, value * low_f, value * high_f, n, True)
        shown = speedup_cell(interval, unstable=unstable)
        supported = (n is None or n >= MIN_PAIRS) and not unstable and not interval.low <= 1.0 <= interval.high
        assert (not shown.startswith(("undecided", "unstable"))) == supported, shown
        assert shown.split(" ", 1)[0].endswith("x") == supported, shown
