"""Whether a probe's figure may be kept: its rounds agree, and it is within what the hardware allows.

The probe times each case in interleaved rounds; each round gives one ratio (a 16-bit
matmul's rate over fp32's, a layer's 16-bit time over its fp32 island's). On a quiet
machine those ratios agree within a few percent. Other jobs slow some calls and not
others, so a figure measured under load scatters from round to round; such a figure is
re-measured, and where the rounds still scatter it is reported as unstable and never
cached or used as evidence. A figure above what the device's hardware can do (bf16 at
50x fp32 on a CPU whose AMX peaks at 16x) is load on the fp32 calls, not speed: also unstable.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

__all__ = ["TIGHT", "ceiling", "holds", "interval", "settled", "tight"]

#: The rounds' ratios (one in five left out as an outlier) must lie within this factor of each other.
TIGHT = 1.5


def interval(values: Sequence[float]) -> tuple[float, float] | None:
    """The range of ``values`` with one value in five left out, the farthest from their median
    (a burst of load may hit one round); ``None`` without a positive finite value."""
    kept = [float(v) for v in values if v > 0 and math.isfinite(v)]
    if not kept:
        return None
    middle = statistics.median(kept)
    kept.sort(key=lambda v: abs(math.log(v / middle)))
    kept = kept[: len(kept) - len(kept) // 5]
    return min(kept), max(kept)


def tight(values: Sequence[float], limit: float = TIGHT) -> bool:
    """Whether at least two rounds were measured and their :func:`interval` spans at most ``limit`` (a factor)."""
    bounds = interval(values)
    return len(values) >= 2 and bounds is not None and bounds[1] <= bounds[0] * limit


#: The most a type can plausibly run above fp32's matmul rate, by device type and the feature
#: that allows it; the first row whose feature the device has applies (``None``: any device).
#: Each figure is twice the hardware's peak ratio, as slack for kernels of unequal quality:
#: AMX tiles do 16x the 16-bit FLOPs per cycle of AVX-512 fp32 FMAs, AVX512-BF16/-FP16 2x;
#: tensor cores about 16x their GPU's fp32 rate (A100, H100); without any of them a 16-bit
#: type at most halves the bytes a matmul moves. TF32 on a CPU runs through bf16 (oneDNN).
_CEILINGS: tuple[tuple[str, tuple[str, ...], str | None, float], ...] = (
    ("cpu", ("bf16", "tf32"), "amx_bf16", 32.0),
    ("cpu", ("fp16",), "amx_fp16", 32.0),
    ("cpu", ("bf16", "tf32"), "avx512_bf16", 4.0),
    ("cpu", ("fp16",), "avx512_fp16", 4.0),
    ("cpu", ("bf16", "fp16", "tf32"), None, 2.5),
    ("cuda", ("bf16", "fp16", "tf32"), "tensor_cores", 32.0),
    ("cuda", ("bf16", "fp16", "tf32"), None, 4.0),
    ("mps", ("bf16", "fp16", "tf32"), None, 8.0),
)


def ceiling(dtype: str, device_type: str, cpu_flags: tuple[str, ...] = (),
            capability: tuple[int, int] | None = None) -> tuple[float, str]:
    """The most ``dtype`` can plausibly run above fp32 here, and what allows it (a CPU flag,
    ``tensor_cores``, or ``this device``): a measured ratio above it is load on the fp32
    calls, not speed (see :data:`_CEILINGS`)."""
    features = set(cpu_flags) | ({"tensor_cores"} if capability is not None and tuple(capability) >= (7, 0) else set())
    for kind, dtypes, feature, bound in _CEILINGS:
        if kind == device_type and dtype in dtypes and (feature is None or feature in features):
            return bound, feature or f"a {device_type} without {'tensor cores' if kind == 'cuda' else 'native 16-bit units'}"
    return math.inf, "this device"


def settled(ratio: float | None, per_round: list[float], bound: tuple[float, str]) -> str | None:
    """Why a measured ratio to fp32 (best calls, and each round's) cannot be kept, or None: its
    rounds scattered (:func:`tight`), or it is above the hardware's ``bound`` (:func:`ceiling`)."""
    if len(per_round) >= 2 and not tight(per_round):
        low, high = interval(per_round) or (math.nan, math.nan)
        return (f"its timing rounds ranged from {low:.3g}x to {high:.3g}x fp32, more than {TIGHT:g}x apart "
                "(other jobs on the machine?)")
    claimed = max([r for r in (ratio, statistics.median(per_round) if per_round else None) if r is not None], default=None)
    if claimed is not None and claimed > bound[0]:
        return f"{claimed:.3g}x fp32 is implausible: {bound[1]} allows at most {bound[0]:g}x (load on the fp32 calls?)"
    return None


def holds(hw: Any, unsettled: tuple[str, ...]) -> bool:
    """Whether a cached probe ``hw`` (a :class:`~mixprec.device.hardware.Hardware`) may be used:
    no class in ``unsettled``, no ratio above :func:`ceiling`, no layer figure flagged unstable."""
    for speed in hw.dtypes.values():
        if speed.klass in unsettled:
            return False
        bound = ceiling(speed.name, hw.device_type, hw.cpu_flags, hw.capability)[0]
        if speed.name != "fp32" and speed.supported and speed.ratio is not None and speed.ratio > bound:
            return False
    return not any(info.get("unstable") for kinds in hw.layers.values() for info in kinds.values())
