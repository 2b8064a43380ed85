"""Whether a probe's figure may be kept: agreement across rounds and the hardware's bounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixprec.device.trust import TIGHT, ceiling, interval, settled, tight


class TestSpread:
    @pytest.mark.parametrize(("rounds", "kept"), [
        ([2.5, 2.6, 2.4], True),
        ([2.5, 5.0, 2.4], False),  # three rounds: no outlier is left out
        ([2.5, 2.6, 2.4, 2.5, 40.0], True),  # one round in five is a burst of load
        ([2.5, 40.0, 2.4, 2.5, 40.0], False),  # two in five are not
        ([0.01, 0.012, 0.011], True),  # an emulated type's figure agrees as well
        ([1.0], False),  # one round is no agreement
        ([], False),
    ])
    def test_rounds(self, rounds, kept):
        assert tight(rounds) is kept

    @given(st.lists(st.floats(0.001, 1000), min_size=2, max_size=12), st.floats(0.01, 100))
    @settings(max_examples=200, deadline=None)
    def test_scale_free_and_bounded_by_the_rounds(self, rounds, scale):
        low, high = interval(rounds)
        assert min(rounds) <= low <= high <= max(rounds)
        assert tight(rounds) == tight([r * scale for r in rounds])  # a ratio's unit never decides
        assert tight(rounds) == (high <= low * TIGHT)


class TestCeiling:
    @pytest.mark.parametrize(("dtype", "device", "flags", "capability", "bound"), [
        ("bf16", "cpu", ("avx2", "avx512_bf16", "amx_bf16"), None, 32.0),
        ("bf16", "cpu", ("avx2", "avx512_bf16"), None, 4.0),
        ("bf16", "cpu", ("avx2",), None, 2.5),
        ("fp16", "cpu", ("avx512_bf16", "amx_bf16"), None, 2.5),  # AMX-BF16 does not make fp16 fast
        ("fp16", "cpu", ("avx512_fp16",), None, 4.0),
        ("tf32", "cpu", ("amx_bf16",), None, 32.0),
        ("bf16", "cuda", (), (9, 0), 32.0),
        ("fp16", "cuda", (), (6, 1), 4.0),
        ("fp16", "mps", (), None, 8.0),
    ])
    def test_table(self, dtype, device, flags, capability, bound):
        assert ceiling(dtype, device, flags, capability)[0] == bound

    def test_a_figure_over_the_bound_or_from_scattered_rounds_is_not_kept(self):
        bound = ceiling("bf16", "cpu", ("avx2", "avx512_bf16"))
        assert settled(2.8, [2.7, 2.8, 2.9], bound) is None  # DESIGN's AVX512-BF16 EPYC: 2.8x
        why = settled(52.983, [50.0, 53.0, 52.9], bound)
        assert why == "53x fp32 is implausible: avx512_bf16 allows at most 4x (load on the fp32 calls?)"
        why = settled(3.0, [1.2, 3.0, 6.0], bound)
        assert why.startswith("its timing rounds ranged from 1.2x to 6x fp32, more than 1.5x apart")
        assert settled(52.983, [50.0, 53.0, 52.9], ceiling("bf16", "cpu", ("amx_bf16",))) is not None
        assert settled(17.9, [17.5, 17.9, 18.2], ceiling("bf16", "cpu", ("amx_bf16",))) is None  # the AMX Xeon
