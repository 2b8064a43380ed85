"""What the hardware states about a precision, for where the probe's timing cannot decide.

The probe measures; on a machine busy enough that its rounds still scatter, its figure is
no evidence (``undecided`` / ``unstable``). Rather than treating the precision as not fast
(which made the same preset resolve to bf16 on a quiet machine and to fp32 beside two other
jobs), decisions then use what the hardware says of itself: the CPU's feature flags, a
CUDA device's compute capability. Every such class is labelled "not measured".
"""

from __future__ import annotations

__all__ = ["stated"]

#: What the hardware states about a precision, used only where the probe's timing cannot decide
#: (a class ``undecided`` or ``unstable``): (device type, precision, the CPU flag or the least
#: CUDA compute capability that states it, its class). The first row that applies wins; a
#: row with no feature applies to every such device. The classes follow what was measured on
#: such parts: AMX-BF16 and AVX512-BF16 run bf16 matmuls 2x to 18x fp32; AVX512-FP16 without
#: AMX-FP16 runs fp16 at about 1.1x; without those units a CPU emulates 16-bit types
#: (0.01x to 0.06x). Tensor cores run bf16 from compute capability 8.0, fp16 from 7.0.
_STATED: tuple[tuple[str, str, str | tuple[int, int] | None, str], ...] = (
    ("cpu", "bf16", "amx_bf16", "fast"),
    ("cpu", "bf16", "avx512_bf16", "fast"),
    ("cpu", "bf16", None, "emulated"),
    ("cpu", "fp16", "amx_fp16", "fast"),
    ("cpu", "fp16", "avx512_fp16", "no_speedup"),
    ("cpu", "fp16", None, "emulated"),
    ("cuda", "bf16", (8, 0), "fast"),
    ("cuda", "fp16", (7, 0), "fast"),
    ("cuda", "tf32", (8, 0), "fast"),
)


def stated(dtype: str, device_type: str, cpu_flags: tuple[str, ...] = (),
           capability: tuple[int, int] | None = None) -> tuple[str, str] | None:
    """The class the hardware states for ``dtype`` and where that comes from, e.g.
    ``("fast", "from the CPU flags (amx_bf16), not measured")``; ``None`` where no row of
    :data:`_STATED` applies (the probe's measurement is then all there is)."""
    for kind, name, feature, klass in _STATED:
        if kind != device_type or name != dtype:
            continue
        if isinstance(feature, tuple):
            if capability is not None and tuple(capability) >= feature:
                return klass, f"from the compute capability ({capability[0]}.{capability[1]} >= {feature[0]}.{feature[1]}), not measured"
            continue
        if feature is None:
            return klass, f"from the CPU flags (none of {', '.join(_STATED_FLAGS[dtype])}), not measured"
        if feature in cpu_flags:
            return klass, f"from the CPU flags ({feature}), not measured"
    return None


_STATED_FLAGS = {name: tuple(f for kind, n, f, _ in _STATED if kind == "cpu" and n == name and isinstance(f, str))
                 for name in ("bf16", "fp16")}
