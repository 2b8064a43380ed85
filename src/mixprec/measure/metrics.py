"""Quality and latency statistics for benchmark results.

Pure functions: they take tensors or numbers and return plain dictionaries, do no
I/O and leave torch's global state alone.

* :func:`quality` compares a precision configuration's output with the fp32
  reference output of the same run (generic error measures plus audio, image or
  embedding specific ones);
* :func:`step_quality` compares per-step predictions of a teacher-forced run (a
  diffusion pipeline's noise predictions on the fp32 run's latents) with fp32's;
* :func:`latency_stats` summarises latency samples, with a distribution-free
  confidence interval of the median taken from order statistics;
* :func:`intervals_overlap` tells whether two such intervals overlap;
* :func:`pareto_front` picks the non-dominated points of a latency/quality plot.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any, Mapping, Sequence

import numpy as np
import torch

__all__ = [
    "KINDS",
    "sqnr_db",
    "LSD_N_FFT",
    "LSD_HOP",
    "LSD_EPS",
    "quality",
    "step_quality",
    "latency_stats",
    "intervals_overlap",
    "pareto_front",
]

#: The output kinds :func:`quality` knows.
KINDS: tuple[str, ...] = ("audio", "image", "embedding")

#: STFT size, hop and floor of the log-spectral distance.
LSD_N_FFT = 512
LSD_HOP = 128
LSD_EPS = 1e-10

# SSIM uses an 11-tap Gaussian window, reflect-padded by 5 samples on each side.
_SSIM_MIN_SIDE = 6


# --------------------------------------------------------------------------- quality


def quality(
    output: torch.Tensor,
    reference: torch.Tensor,
    kind: str,
    *,
    sample_rate: int | None = None,
) -> dict[str, float | None]:
    """Compare an output with the fp32 reference output of the same inputs.

    Both tensors are copied to the CPU in float64 first. Non-finite values in
    ``output`` do not raise: the metrics they spoil come out as ``nan`` (or
    ``inf`` / ``-inf`` where that is the defined limit) and ``nonfinite`` counts them.

    Always present:

    * ``max_abs_err``: largest absolute difference;
    * ``rel_err``: ``||out - ref||_2 / ||ref||_2``;
    * ``cosine``: cosine similarity of the flattened tensors;
    * ``sqnr_db``: ``10 log10(sum ref^2 / sum (out - ref)^2)``, ``inf`` when identical;
    * ``nonfinite``: number of non-finite values in ``output``.

    Per kind:

    * ``audio`` (``(batch, samples)``): ``snr_db`` (the SQNR of each item, averaged
      over the batch) and ``lsd_db`` (log-spectral distance from power spectra with
      ``n_fft=512``, hop 128 and a Hann window, averaged over items);
    * ``image`` (``(batch, 3, H, W)`` in ``[0, 1]``): ``psnr_db`` and ``ssim`` from
      torchmetrics with ``data_range=1.0``; ``ssim`` is ``None`` for images smaller
      than 6 pixels on a side, too small for its 11-tap window;
    * ``embedding`` (``(batch, dim)``): ``embedding_cosine_mean`` and
      ``embedding_cosine_min`` over the per-row cosine similarities.

    Args:
        output: the output of the configuration under test.
        reference: the fp32 reference output, same shape.
        kind: ``audio``, ``image`` or ``embedding``.
        sample_rate: audio sample rate in Hz. Accepted for callers that know it;
            the metrics here do not depend on it.

    Returns:
        Metric name to value; keys that do not apply to ``kind`` are absent.

    Raises:
        ValueError: unknown ``kind``, shapes that differ, an empty tensor or a
            shape that does not fit ``kind``.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown output kind {kind!r}; valid kinds: {', '.join(KINDS)}")
    if tuple(output.shape) != tuple(reference.shape):
        raise ValueError(
            f"output shape {tuple(output.shape)} does not match reference shape {tuple(reference.shape)}"
        )
    if output.numel() == 0:
        raise ValueError(f"cannot compare empty tensors (shape {tuple(output.shape)})")
    if sample_rate is not None and (isinstance(sample_rate, bool) or not isinstance(sample_rate, Real) or not sample_rate > 0):
        raise ValueError(f"sample_rate must be a positive number of Hz or None, got {sample_rate!r}")
    _check_kind_shape(kind, tuple(output.shape))

    out = output.detach().to(device="cpu", dtype=torch.float64)
    ref = reference.detach().to(device="cpu", dtype=torch.float64)
    diff = out - ref

    ref_norm = _item(torch.linalg.vector_norm(ref))
    diff_norm = _item(torch.linalg.vector_norm(diff))
    result: dict[str, float | None] = {
        "max_abs_err": _item(diff.abs().max()),
        "rel_err": _ratio(diff_norm, ref_norm),
        "cosine": _cosine(out.flatten(), ref.flatten()),
        "sqnr_db": _db(_item(ref.square().sum()), _item(diff.square().sum())),
        "nonfinite": int((~torch.isfinite(out)).sum().item()),
    }
    if kind == "audio":
        result.update(_audio(out, ref))
    elif kind == "image":
        result.update(_image(out, ref))
    else:
        result.update(_embedding(out, ref))
    return result


def _check_kind_shape(kind: str, shape: tuple[int, ...]) -> None:
    if kind in ("audio", "embedding") and len(shape) != 2:
        layout = "(batch, samples)" if kind == "audio" else "(batch, dim)"
        raise ValueError(f"{kind} outputs must have shape {layout}, got {shape}")
    if kind == "image" and (len(shape) != 4 or shape[1] != 3):
        raise ValueError(f"image outputs must have shape (batch, 3, H, W), got {shape}")


def _item(value: torch.Tensor) -> float:
    return float(value.item())


def _ratio(num: float, den: float) -> float:
    """``num / den`` with ``0/0 = 0`` and ``x/0 = inf``."""
    if math.isnan(num) or math.isnan(den):
        return math.nan
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def _db(signal: float, noise: float) -> float:
    """``10 log10(signal / noise)``: ``inf`` for zero noise, ``-inf`` for zero signal."""
    if math.isnan(signal) or math.isnan(noise):
        return math.nan
    if noise == 0.0:
        return math.inf
    if math.isinf(noise):
        return math.nan if math.isinf(signal) else -math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def sqnr_db(output: torch.Tensor, reference: torch.Tensor) -> float:
    """``10 log10(sum ref^2 / sum (out - ref)^2)`` of two tensors of one shape, in float64 on the
    CPU: ``inf`` when identical, ``nan`` where ``output`` holds a non-finite value.

    Raises:
        ValueError: shapes that differ.
    """
    if tuple(output.shape) != tuple(reference.shape):
        raise ValueError(f"output shape {tuple(output.shape)} does not match reference shape {tuple(reference.shape)}")
    out = output.detach().to(device="cpu", dtype=torch.float64)
    ref = reference.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(out).all()):
        return math.nan
    return _db(_item(ref.square().sum()), _item((out - ref).square().sum()))


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two vectors: 1 for two zero vectors, nan for one."""
    na = _item(torch.linalg.vector_norm(a))
    nb = _item(torch.linalg.vector_norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0 or not (math.isfinite(na) and math.isfinite(nb)):
        return math.nan
    return _item(torch.dot(a, b)) / (na * nb)


def _audio(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float | None]:
    diff = out - ref
    signal = ref.square().sum(dim=1).tolist()
    noise = diff.square().sum(dim=1).tolist()
    snr = [_db(s, n) for s, n in zip(signal, noise)]
    return {"snr_db": _mean(snr), "lsd_db": _lsd(out, ref)}


def _mean(values: Sequence[float]) -> float:
    if any(math.isnan(v) for v in values):
        return math.nan
    if math.inf in values and -math.inf in values:
        return math.nan
    if math.inf in values:
        return math.inf
    if -math.inf in values:
        return -math.inf
    return math.fsum(values) / len(values)


def _power_db(x: torch.Tensor) -> torch.Tensor:
    # Reflect padding needs more samples than half a window; pad short clips with zeros.
    pad_mode = "reflect" if x.shape[-1] > LSD_N_FFT // 2 else "constant"
    window = torch.hann_window(LSD_N_FFT, dtype=x.dtype, device=x.device)
    spec = torch.stft(
        x,
        n_fft=LSD_N_FFT,
        hop_length=LSD_HOP,
        window=window,
        center=True,
        pad_mode=pad_mode,
        return_complex=True,
    )
    return 10.0 * torch.log10(spec.abs().square() + LSD_EPS)


def _lsd(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Log-spectral distance in dB, averaged over frames and then over items."""
    if not bool(torch.isfinite(out).all()):
        return math.nan
    # (batch, bins, frames): RMS over bins, mean over frames, mean over items.
    delta = _power_db(out) - _power_db(ref)
    per_frame = delta.square().mean(dim=1).sqrt()
    return _item(per_frame.mean(dim=1).mean())


def _image(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float | None]:
    from torchmetrics.functional.image import (
        peak_signal_noise_ratio,
        structural_similarity_index_measure,
    )

    psnr = _item(peak_signal_noise_ratio(out, ref, data_range=1.0))
    ssim: float | None = None
    if min(out.shape[-2:]) >= _SSIM_MIN_SIDE:
        if bool(torch.isfinite(out).all()):
            ssim = _item(structural_similarity_index_measure(out, ref, data_range=1.0))
        else:
            ssim = math.nan
    return {"psnr_db": psnr, "ssim": ssim}


def _embedding(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float | None]:
    cosines = [_cosine(o, r) for o, r in zip(out, ref)]
    if any(math.isnan(c) for c in cosines):
        return {"embedding_cosine_mean": math.nan, "embedding_cosine_min": math.nan}
    return {"embedding_cosine_mean": math.fsum(cosines) / len(cosines), "embedding_cosine_min": min(cosines)}


def step_quality(steps: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """Compare the per-step predictions of a teacher-forced run with the fp32 run's.

    A diffusion pipeline teacher-forced on the fp32 run's latents predicts the noise
    at every step from the same latents as fp32 did, so the difference is each
    step's own error, not one amplified along a free-running trajectory.

    Args:
        steps: ``(steps, ...)`` predictions of the configuration under test.
        reference: the fp32 run's, same shape.

    Returns:
        ``step_sqnr_db``: ``10 log10(sum ref^2 / sum (out - ref)^2)`` over every step
        stacked (``inf`` when identical, ``nan`` when ``steps`` holds a non-finite
        value); ``step_sqnr_worst_db``: the lowest SQNR of a single step.

    Raises:
        ValueError: shapes that differ or an empty tensor.
    """
    if tuple(steps.shape) != tuple(reference.shape):
        raise ValueError(
            f"step predictions of shape {tuple(steps.shape)} do not match the reference's {tuple(reference.shape)}"
        )
    if steps.dim() == 0 or steps.numel() == 0:
        raise ValueError(f"step predictions need a leading steps dimension and values, got shape {tuple(steps.shape)}")
    out = steps.detach().to(device="cpu", dtype=torch.float64)
    ref = reference.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(out).all()):
        return {"step_sqnr_db": math.nan, "step_sqnr_worst_db": math.nan}
    signal = ref.reshape(ref.shape[0], -1).square().sum(dim=1)
    noise = (out - ref).reshape(ref.shape[0], -1).square().sum(dim=1)
    per_step = [_db(s, n) for s, n in zip(signal.tolist(), noise.tolist())]
    return {"step_sqnr_db": _db(_item(signal.sum()), _item(noise.sum())), "step_sqnr_worst_db": min(per_step)}


# --------------------------------------------------------------------------- latency


def latency_stats(samples: Sequence[float], *, confidence: float = 0.95) -> dict[str, float]:
    """Summarise latency samples, with a confidence interval of the median.

    The interval is distribution-free: it is the pair of order statistics
    ``X_(j) <= X_(k)`` (1-based ranks, ``k = n + 1 - j``) with the largest ``j``
    such that ``P(X_(j) <= median <= X_(k))``, which is
    ``P(j <= B <= k - 1)`` for ``B ~ Binomial(n, 1/2)``, is at least
    ``confidence``. When even the sample minimum and maximum do not reach that
    coverage (``n`` too small: 5 or fewer samples at 95 %), the interval is the
    minimum and maximum and ``ci_exact`` is ``False``.

    Args:
        samples: latencies in seconds (any unit works; the results share it).
        confidence: wanted coverage of the interval, strictly between 0 and 1.

    Returns:
        ``median``, ``p10``, ``p90`` (linear interpolation), ``mean``, ``n``,
        ``ci_low``, ``ci_high``, ``ci_exact`` (whether the interval reaches
        ``confidence``) and ``ci_coverage`` (the coverage it actually has).

    Raises:
        ValueError: no samples, a non-finite sample or ``confidence`` outside (0, 1).
    """
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be a number strictly between 0 and 1, got {confidence!r}")
    values = np.asarray([float(s) for s in samples], dtype=np.float64)
    if values.size == 0:
        raise ValueError("latency_stats needs at least one sample, got none")
    if not np.isfinite(values).all():
        raise ValueError(f"latency samples must be finite, got {[float(v) for v in values if not math.isfinite(v)]}")
    ordered = np.sort(values)
    n = int(ordered.size)
    j, coverage = _median_ci_rank(n, confidence)
    exact = j is not None
    if j is None:
        low, high = float(ordered[0]), float(ordered[-1])
        coverage = _coverage(n, 1)
    else:
        low, high = float(ordered[j - 1]), float(ordered[n - j])
    return {
        "median": float(np.median(ordered)),
        "p10": float(np.percentile(ordered, 10)),
        "p90": float(np.percentile(ordered, 90)),
        "mean": float(ordered.mean()),
        "n": n,
        "ci_low": low,
        "ci_high": high,
        "ci_exact": exact,
        "ci_coverage": coverage,
    }


def _binom_half_cdf(n: int, k: int) -> float:
    """``P(B <= k)`` for ``B ~ Binomial(n, 1/2)``, exactly up to the final division."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / 2**n


def _coverage(n: int, j: int) -> float:
    """Coverage of ``[X_(j), X_(n+1-j)]`` for the median: ``1 - 2 P(B <= j - 1)``."""
    return 1.0 - 2.0 * _binom_half_cdf(n, j - 1)


def _median_ci_rank(n: int, confidence: float) -> tuple[int | None, float]:
    """Largest lower rank ``j`` whose symmetric interval reaches ``confidence``."""
    best: tuple[int | None, float] = (None, math.nan)
    for j in range(1, (n + 1) // 2 + 1):
        coverage = _coverage(n, j)
        if coverage < confidence:
            break
        best = (j, coverage)
    return best


def intervals_overlap(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether the median confidence intervals of two :func:`latency_stats` results overlap.

    Touching intervals count as overlapping; an interval with a ``nan`` bound
    overlaps nothing.

    Raises:
        ValueError: either mapping lacks ``ci_low`` or ``ci_high``.
    """
    bounds = []
    for name, stats in (("a", a), ("b", b)):
        missing = [key for key in ("ci_low", "ci_high") if stats.get(key) is None]
        if missing:
            raise ValueError(f"{name} has no {' or '.join(missing)}; pass latency_stats() results (keys: {sorted(stats)})")
        bounds.append((float(stats["ci_low"]), float(stats["ci_high"])))
    (a_low, a_high), (b_low, b_high) = bounds
    return a_low <= b_high and b_low <= a_high


# --------------------------------------------------------------------------- pareto


def pareto_front(
    points: Sequence[tuple[float, float]],
    *,
    minimize: tuple[bool, bool] = (True, False),
) -> list[int]:
    """Indices of the non-dominated points, in input order.

    A point dominates another when it is at least as good on both axes and
    strictly better on one. Equal points do not dominate each other, so
    duplicates on the front are all kept. Points with a ``nan`` coordinate are
    never on the front and dominate nothing; infinities compare as usual.

    Args:
        points: ``(x, y)`` pairs.
        minimize: for each axis, whether smaller is better. The default
            minimises x (latency) and maximises y (quality).

    Raises:
        ValueError: a point that is not a pair or ``minimize`` that is not two booleans.
    """
    if len(minimize) != 2 or not all(isinstance(m, bool) for m in minimize):
        raise ValueError(f"minimize must be a pair of booleans, got {minimize!r}")
    signs = tuple(1.0 if m else -1.0 for m in minimize)
    costs: list[tuple[float, float] | None] = []
    for i, point in enumerate(points):
        if len(point) != 2:
            raise ValueError(f"point {i} must be an (x, y) pair, got {point!r}")
        x, y = float(point[0]), float(point[1])
        costs.append(None if math.isnan(x) or math.isnan(y) else (signs[0] * x, signs[1] * y))
    valid = [(i, c) for i, c in enumerate(costs) if c is not None]
    front = []
    for i, (cx, cy) in valid:
        dominated = any(
            ox <= cx and oy <= cy and (ox < cx or oy < cy) for j, (ox, oy) in valid if j != i
        )
        if not dominated:
            front.append(i)
    return front
