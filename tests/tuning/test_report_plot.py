"""The tune plot's scale and labels: candidates use the height, labels never overlap."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mixprec.tuning.report import label_offsets, plot_limits

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)


class TestPlotLimits:
    @settings(max_examples=200, deadline=None)
    @given(values=st.lists(finite, min_size=1, max_size=30), bound=finite,
           extra=st.lists(st.sampled_from([math.inf, math.nan]), max_size=3))
    @example(values=[5e-324], bound=0.0, extra=[])  # a span so small that a tenth of it rounds to nothing
    def test_every_value_inside_and_infinite_ones_above(self, values, bound, extra):
        low, high, cap = plot_limits(values + extra, bound)
        assert low < min(values) and max(values) < cap < high

    @settings(max_examples=200, deadline=None)
    @given(values=st.lists(finite, min_size=2, max_size=30), bound=finite)
    def test_the_candidates_fill_most_of_the_height(self, values, bound):
        low, high, _ = plot_limits(values, bound)
        spread = max(values) - min(values)
        if spread > 1e-6 * max(1.0, abs(max(values))):
            # The values take at least a seventh of the axis, wherever the bound lies.
            assert spread / (high - low) > 1 / 7

    @pytest.mark.parametrize("values, bound, shown", [
        ([0.99995, 0.99999, 1.0], 0.999, False),  # cosines far above their bound: the bound is named at the edge
        ([0.9992, 0.9995, 0.9999], 0.999, True),
        ([28.0, 35.0, 41.0], 30.0, True),
        ([55.0, 56.0], 30.0, False),
        ([1.0, 1.0, 1.0], 1.0, True),
    ])
    def test_the_bound_is_drawn_when_near_the_candidates(self, values, bound, shown):
        low, high, _ = plot_limits(values, bound)
        assert (low <= bound <= high) is shown

    def test_only_the_bound(self):
        low, high, cap = plot_limits([math.nan, math.inf], 30.0)
        assert low < 30.0 < cap < high


class TestLabelOffsets:
    @staticmethod
    def _boxes(points, placed, xlim, ylim, size=(560.0, 300.0), char=(4.5, 8.0)):
        out = []
        for index, (dx, dy) in placed.items():
            x, y = points[index]
            px = (x - xlim[0]) / (xlim[1] - xlim[0]) * size[0] + dx
            py = (y - ylim[0]) / (ylim[1] - ylim[0]) * size[1] + dy
            out.append((px, py, px + char[0] * len(str(index)), py + char[1]))
        return out

    @settings(max_examples=150, deadline=None)
    @given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 1)), min_size=1, max_size=40))
    def test_labels_never_overlap(self, coords):
        points = dict(enumerate(coords))
        placed = label_offsets(points, (0, 100), (0, 1))
        boxes = self._boxes(points, placed, (0, 100), (0, 1))
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)

    @pytest.mark.parametrize("count", [2, 5, 12])
    def test_the_first_points_win_a_crowded_spot(self, count):
        points = {i: (50.0, 0.5) for i in range(count)}  # all on one spot
        placed = label_offsets(points, (0, 100), (0, 1))
        assert 0 in placed and 1 in placed  # the first given (the chosen candidate) always keeps its label
        assert len(placed) <= 6 and len(placed) == min(count, len(placed))

    def test_points_apart_all_get_the_default_offset(self):
        points = {i: (i * 10.0, 0.5) for i in range(8)}
        assert label_offsets(points, (0, 100), (0, 1)) == {i: (4, 4) for i in range(8)}
