from __future__ import annotations

import math

import pytest
import torch

from mixprec.measure.metrics import intervals_overlap, latency_stats, pareto_front, quality


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------- generic


def test_generic_metrics_follow_their_formulas():
    ref = torch.tensor([[3.0, 4.0, 0.0, 0.0]])
    noise = torch.tensor([[0.0, 0.0, 0.5, 0.0]])
    m = quality(ref + noise, ref, "embedding")
    # ||ref|| = 5, ||noise|| = 0.5
    assert m["max_abs_err"] == pytest.approx(0.5)
    assert m["rel_err"] == pytest.approx(0.1)
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(25 / 0.25))  # 20 dB
    assert m["cosine"] == pytest.approx(5 / math.sqrt(25.25))
    assert m["nonfinite"] == 0


def test_generic_metrics_with_random_noise():
    ref = torch.randn(4, 1000, generator=_gen(1))
    noise = 0.01 * torch.randn(4, 1000, generator=_gen(2))
    m = quality(ref + noise, ref, "audio")
    ref64, noise64 = ref.double(), ((ref + noise).double() - ref.double())
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(ref64.square().sum() / noise64.square().sum()), rel=1e-9)
    assert m["rel_err"] == pytest.approx(float(noise64.norm() / ref64.norm()), rel=1e-9)
    assert m["max_abs_err"] == pytest.approx(float(noise64.abs().max()), rel=1e-9)


def test_identical_outputs_are_exact():
    ref = torch.randn(2, 8, generator=_gen())
    m = quality(ref.clone(), ref, "embedding")
    assert m["sqnr_db"] == math.inf
    assert m["max_abs_err"] == 0.0 and m["rel_err"] == 0.0
    assert m["cosine"] == pytest.approx(1.0)


def test_cosine_of_orthogonal_and_opposite_vectors():
    ref = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert quality(torch.tensor([[0.0, 1.0], [-1.0, 0.0]]), ref, "embedding")["cosine"] == pytest.approx(0.0)
    assert quality(-ref, ref, "embedding")["cosine"] == pytest.approx(-1.0)


def test_inputs_are_compared_in_float64():
    ref = torch.ones(1, 4, dtype=torch.bfloat16)
    out = ref.clone()
    out[0, 0] = 1.0078125  # one bf16 ulp above 1
    m = quality(out, ref, "embedding")
    assert m["max_abs_err"] == 0.0078125
    assert isinstance(m["max_abs_err"], float)


# --------------------------------------------------------------------------- audio


def test_audio_snr_is_averaged_over_items():
    ref = torch.ones(2, 1024)
    out = ref.clone()
    out[0] += 0.1  # SNR 20 dB
    out[1] += 0.01  # SNR 40 dB
    m = quality(out, ref, "audio", sample_rate=24000)
    assert m["snr_db"] == pytest.approx(30.0)
    # the batch-level SQNR is not the mean of the per-item values
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(2 / (0.01 + 0.0001)))


def test_lsd_is_zero_for_identical_and_6db_for_double_amplitude():
    ref = torch.randn(3, 4000, generator=_gen(3))
    assert quality(ref.clone(), ref, "audio")["lsd_db"] == pytest.approx(0.0, abs=1e-12)
    # doubling the amplitude quadruples the power in every bin: 10 log10(4) dB everywhere
    assert quality(2 * ref, ref, "audio")["lsd_db"] == pytest.approx(10 * math.log10(4), rel=1e-6)


def test_lsd_handles_clips_shorter_than_the_window():
    ref = torch.randn(1, 100, generator=_gen(4))
    m = quality(2 * ref, ref, "audio")
    assert m["lsd_db"] == pytest.approx(10 * math.log10(4), rel=1e-3)


def test_audio_keys_only():
    ref = torch.randn(1, 600, generator=_gen())
    m = quality(ref, ref, "audio")
    assert {"snr_db", "lsd_db"} <= set(m)
    assert not {"psnr_db", "ssim", "embedding_cosine_mean", "embedding_cosine_min"} & set(m)


# --------------------------------------------------------------------------- image


def test_image_psnr_of_constant_offset_is_20db():
    ref = 0.8 * torch.rand(2, 3, 16, 16, generator=_gen(5), dtype=torch.float64)
    m = quality(ref + 0.1, ref, "image")  # MSE 0.01 with data range 1
    assert m["psnr_db"] == pytest.approx(20.0, abs=1e-6)
    assert m["ssim"] < 1.0


def test_image_ssim_of_identical_is_one():
    ref = torch.rand(1, 3, 32, 32, generator=_gen(6))
    m = quality(ref.clone(), ref, "image")
    assert m["ssim"] == pytest.approx(1.0)
    assert m["psnr_db"] == math.inf
    assert "snr_db" not in m and "embedding_cosine_min" not in m


def test_image_too_small_for_ssim_window():
    ref = torch.rand(1, 3, 4, 4, generator=_gen(7))
    m = quality(ref, ref, "image")
    assert m["ssim"] is None
    assert m["psnr_db"] == math.inf


# --------------------------------------------------------------------------- embedding


def test_embedding_row_cosines():
    ref = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    out = torch.tensor([[1.0, 1.0], [2.0, 2.0]])  # cos 1/sqrt(2) and 1
    m = quality(out, ref, "embedding")
    assert m["embedding_cosine_min"] == pytest.approx(1 / math.sqrt(2))
    assert m["embedding_cosine_mean"] == pytest.approx((1 / math.sqrt(2) + 1) / 2)
    assert "snr_db" not in m and "psnr_db" not in m


# --------------------------------------------------------------------------- non-finite and errors


@pytest.mark.parametrize(
    "kind, shape",
    [("audio", (2, 1024)), ("image", (1, 3, 16, 16)), ("embedding", (3, 8))],
)
def test_nonfinite_outputs_are_counted_not_raised(kind, shape):
    ref = torch.rand(*shape, generator=_gen(8))
    out = ref.clone().flatten()
    out[0] = float("nan")
    out[1] = float("inf")
    m = quality(out.reshape(shape), ref, kind)
    assert m["nonfinite"] == 2
    assert math.isnan(m["max_abs_err"])
    assert math.isnan(m["cosine"])
    assert math.isnan(m["sqnr_db"])
    for key in ("snr_db", "lsd_db", "psnr_db", "ssim", "embedding_cosine_mean", "embedding_cosine_min"):
        if key in m:
            assert math.isnan(m[key]) or math.isinf(m[key]), (key, m[key])


def test_infinite_output_without_nan():
    ref = torch.ones(1, 4)
    out = ref.clone()
    out[0, 0] = float("inf")
    m = quality(out, ref, "embedding")
    assert m["nonfinite"] == 1
    assert m["max_abs_err"] == math.inf
    assert m["rel_err"] == math.inf
    assert m["sqnr_db"] == -math.inf


def test_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(2, 5\).*\(2, 6\)"):
        quality(torch.zeros(2, 5), torch.zeros(2, 6), "embedding")


def test_unknown_kind_lists_valid_kinds():
    with pytest.raises(ValueError, match="'video'.*audio, image, embedding"):
        quality(torch.zeros(2, 5), torch.zeros(2, 5), "video")


def test_shape_must_fit_kind():
    with pytest.raises(ValueError, match=r"\(batch, 3, H, W\)"):
        quality(torch.zeros(2, 5), torch.zeros(2, 5), "image")


# --------------------------------------------------------------------------- latency


def test_latency_stats_of_a_known_list():
    samples = [5.0, 1.0, 4.0, 2.0, 3.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
    s = latency_stats(samples)
    assert s["median"] == 6.0
    assert s["mean"] == 6.0
    assert s["p10"] == pytest.approx(2.0)  # numpy linear: rank 0.1 * 10 = 1
    assert s["p90"] == pytest.approx(10.0)
    assert s["n"] == 11


def test_median_ci_for_20_samples_uses_binomial_ranks():
    # P(B <= 5) for B ~ Bin(20, 1/2) = (1 + 20 + 190 + 1140 + 4845 + 15504) / 2**20 = 21700 / 2**20,
    # so [X_(6), X_(15)] covers the median with 1 - 2 * 0.0207 = 0.9586 >= 0.95, while
    # [X_(7), X_(14)] adds 2 * C(20, 6) / 2**20 = 0.0739 of risk and only covers 0.885.
    samples = [float(v) for v in range(101, 121)]  # X_(i) = 100 + i
    s = latency_stats(list(reversed(samples)))
    assert s["ci_low"] == 106.0
    assert s["ci_high"] == 115.0
    assert s["ci_exact"] is True
    assert s["ci_coverage"] == pytest.approx(1 - 2 * 21700 / 2**20)
    assert s["ci_low"] <= s["median"] <= s["ci_high"]


def test_median_ci_with_a_lower_confidence_is_narrower():
    samples = [float(v) for v in range(1, 21)]
    wide, narrow = latency_stats(samples), latency_stats(samples, confidence=0.8)
    assert narrow["ci_low"] > wide["ci_low"] and narrow["ci_high"] < wide["ci_high"]


def test_too_few_samples_give_min_max_and_say_so():
    s = latency_stats([3.0, 1.0, 2.0])
    assert s["ci_exact"] is False
    assert (s["ci_low"], s["ci_high"]) == (1.0, 3.0)
    assert s["ci_coverage"] == pytest.approx(0.75)
    # six samples reach 95 % with the extremes: 1 - 2 / 64
    assert latency_stats([1.0, 2, 3, 4, 5, 6])["ci_exact"] is True


def test_latency_stats_rejects_bad_input():
    with pytest.raises(ValueError, match="at least one sample"):
        latency_stats([])
    with pytest.raises(ValueError, match="1.5"):
        latency_stats([1.0], confidence=1.5)
    with pytest.raises(ValueError, match="finite"):
        latency_stats([1.0, float("nan")])


def test_intervals_overlap():
    a = {"ci_low": 1.0, "ci_high": 2.0}
    assert intervals_overlap(a, {"ci_low": 1.5, "ci_high": 3.0})
    assert intervals_overlap(a, {"ci_low": 2.0, "ci_high": 3.0})  # touching
    assert not intervals_overlap(a, {"ci_low": 2.1, "ci_high": 3.0})
    assert not intervals_overlap({"ci_low": 5.0, "ci_high": 6.0}, a)
    assert intervals_overlap(latency_stats([1.0, 1.1, 1.2]), latency_stats([1.15, 1.3, 1.4]))
    with pytest.raises(ValueError, match="ci_high"):
        intervals_overlap({"ci_low": 1.0}, a)


# --------------------------------------------------------------------------- pareto


def test_pareto_front_of_a_small_set():
    points = [
        (1.0, 10.0),  # 0: fastest
        (2.0, 30.0),  # 1: front
        (2.5, 20.0),  # 2: dominated by 1
        (3.0, math.inf),  # 3: exact, slowest
        (2.0, 30.0),  # 4: duplicate of 1, kept
        (0.5, math.nan),  # 5: NaN never on the front
        (4.0, math.inf),  # 6: dominated by 3
    ]
    assert pareto_front(points) == [0, 1, 3, 4]


def test_pareto_front_equal_on_one_axis():
    # same latency, better quality dominates; same quality, lower latency dominates
    assert pareto_front([(1.0, 5.0), (1.0, 6.0), (0.5, 6.0)]) == [2]


def test_pareto_front_other_directions_and_empty():
    points = [(1.0, 1.0), (2.0, 2.0), (0.5, 3.0)]
    assert pareto_front(points, minimize=(True, True)) == [0, 2]
    assert pareto_front(points, minimize=(False, False)) == [1, 2]
    assert pareto_front([]) == []
    assert pareto_front([(math.nan, 1.0)]) == []
    with pytest.raises(ValueError, match="pair of booleans"):
        pareto_front(points, minimize=("yes", True))


# --------------------------------------------------------------------------- per step


def test_step_quality_stacks_the_steps_and_finds_the_worst():
    from mixprec.measure.metrics import step_quality

    ref = torch.ones(3, 2, 4)  # 3 steps, each with signal 8
    noise = torch.zeros(3, 2, 4)
    noise[1, 0, 0] = 0.1  # only step 1 differs: noise 0.01
    m = step_quality(ref + noise, ref)
    assert m["step_sqnr_db"] == pytest.approx(10 * math.log10(24 / 0.01), rel=1e-6)
    assert m["step_sqnr_worst_db"] == pytest.approx(10 * math.log10(8 / 0.01), rel=1e-6)
    assert step_quality(ref, ref) == {"step_sqnr_db": math.inf, "step_sqnr_worst_db": math.inf}


def test_step_quality_nonfinite_and_bad_shapes():
    from mixprec.measure.metrics import step_quality

    ref = torch.ones(2, 3)
    broken = ref.clone()
    broken[0, 0] = math.inf
    m = step_quality(broken, ref)
    assert math.isnan(m["step_sqnr_db"]) and math.isnan(m["step_sqnr_worst_db"])
    with pytest.raises(ValueError, match="do not match"):
        step_quality(torch.ones(2, 4), ref)
    with pytest.raises(ValueError, match="leading steps dimension"):
        step_quality(torch.tensor(1.0), torch.tensor(1.0))
