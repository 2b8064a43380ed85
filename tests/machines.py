"""The hardware classes the suite runs under: scripted machine descriptions, never the real CPU.

Each class is what :func:`mixprec.device.hardware.probe` would record on such a machine
(figures from the machines named beside each one), handed to every test and every process
it starts through ``MIXPREC_PROBE_FILE`` (``tests/conftest.py``). ``MIXPREC_TEST_HARDWARE``
or ``pytest --hardware-class`` picks one; ``make test-hardware`` runs the tests marked
``hardware`` under each.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from mixprec.device.hardware import DtypeSpeed, Hardware

#: The class a run gets when it names none.
DEFAULT = "avx512-bf16"
#: The environment variable naming the class.
VARIABLE = "MIXPREC_TEST_HARDWARE"


def _speed(name: str, fp32: float, ratio: float | None, klass: str, supported: bool = True) -> DtypeSpeed:
    return DtypeSpeed(name, supported, round(fp32 * ratio, 2) if ratio is not None else None, ratio, klass)


def _layers(gains: dict[str, float], margin: float = 0.1) -> dict[str, dict]:
    return {kind: {"gain": gain, "island": gain > 1 + margin, "unstable": False, "range": [round(gain * 0.95, 3), round(gain * 1.05, 3)]}
            for kind, gain in gains.items()}


def _cpu(name: str, flags: tuple[str, ...], fp32: float, bf16: tuple[float, str], fp16: tuple[float, str], medium: float,
         layers: dict[str, dict[str, float]]) -> Hardware:
    """``medium``: the fp32 matmul's speed at that level over ``highest`` (1.0: the level computes what fp32 does)."""
    return Hardware(
        device_type="cpu", name=name, capability=None, memory_bytes=24 * 2 ** 30, cpu_flags=flags, threads=1,
        torch_version=torch.__version__,
        dtypes={"fp32": _speed("fp32", fp32, 1.0, "fast"),
                "tf32": _speed("tf32", fp32, 1.0, "unsupported", supported=False),
                "bf16": _speed("bf16", fp32, *bf16), "fp16": _speed("fp16", fp32, *fp16)},
        matmul_levels={"highest": fp32, "high": fp32, "medium": round(fp32 * medium, 2)},
        matmul_exact={"high": True, "medium": medium == 1.0}, matmul_size=512, seconds=0.4,
        layers={dtype: _layers(gains) for dtype, gains in layers.items()}, clock="cpu-time, 1 thread")


#: AMD EPYC with AVX2 only: bf16 and fp16 emulated (about 60x slower than fp32); the matmul
#: levels change nothing.
AVX2 = _cpu("Simulated AMD EPYC (AVX2 only)", ("avx2", "fma", "f16c"), 81.0, (0.016, "emulated"), (0.016, "emulated"),
            1.0, {})
#: AMD EPYC with AVX512-BF16: bf16 about twice fp32, fp16 emulated; ``medium`` computes in bf16.
AVX512_BF16 = _cpu("Simulated AMD EPYC (AVX512-BF16)", ("avx2", "avx512f", "avx512_bf16", "fma", "f16c"), 100.0,
                   (2.13, "fast"), (0.014, "emulated"), 2.0,
                   {"bf16": {"Conv1d": 0.59, "ConvTranspose1d": 0.8, "Conv2d": 0.7, "LSTM": 0.87, "GRU": 1.91,
                             "LayerNorm": 0.71, "GroupNorm": 0.64}})
#: Intel Xeon with AMX-BF16 and AVX512-FP16: bf16 many times fp32, fp16 about fp32's speed.
AMX = _cpu("Simulated Intel Xeon (AMX-BF16, AVX512-FP16)",
           ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "fma", "f16c"), 100.0,
           (17.9, "fast"), (1.1, "no_speedup"), 2.8,
           {"bf16": {"Conv1d": 0.8, "ConvTranspose1d": 0.9, "Conv2d": 0.85, "LSTM": 0.95, "GRU": 1.6,
                     "LayerNorm": 0.7, "GroupNorm": 0.7}})
#: One NVIDIA H100 (benchmarks/results/gpu-nvidia-h100-80gb-hbm3.md): TF32, bf16 and fp16
#: fast; recurrent layers faster kept in fp32 under bf16. The class's CPU is the AMX one.
H100 = Hardware(
    device_type="cuda", name="Simulated NVIDIA H100 80GB HBM3", capability=(9, 0), memory_bytes=80 * 2 ** 30,
    cpu_flags=AMX.cpu_flags, threads=16, torch_version=torch.__version__,
    dtypes={"fp32": _speed("fp32", 47544.0, 1.0, "fast"), "tf32": _speed("tf32", 47544.0, 4.43, "fast"),
            "bf16": _speed("bf16", 47544.0, 7.9, "fast"), "fp16": _speed("fp16", 47544.0, 9.31, "fast")},
    matmul_levels={"highest": 47544.0, "high": 210786.0, "medium": 212791.0}, matmul_exact={"high": False, "medium": False},
    matmul_size=2048, seconds=2.1,
    layers={"bf16": _layers({"Conv1d": 0.74, "ConvTranspose1d": 0.83, "Conv2d": 0.82, "LSTM": 5.17, "GRU": 5.73,
                             "LayerNorm": 0.54, "GroupNorm": 0.66}),
            "fp16": _layers({"Conv1d": 0.74, "ConvTranspose1d": 0.82, "Conv2d": 0.82, "LSTM": 0.94, "GRU": 0.84,
                             "LayerNorm": 0.52, "GroupNorm": 0.65})},
    clock="cuda-events")

#: Per class: the machine a test sees (the one decisions are made for) and every
#: description the probe file holds (a CUDA class describes its host CPU too).
CLASSES: dict[str, tuple[Hardware, tuple[Hardware, ...]]] = {
    "avx2": (AVX2, (AVX2,)),
    "avx512-bf16": (AVX512_BF16, (AVX512_BF16,)),
    "amx": (AMX, (AMX,)),
    "cuda": (H100, (AMX, H100)),
}


def check_name(name: str, source: str) -> str:
    """``name`` as a class, or a ValueError naming ``source`` and the valid classes."""
    if name not in CLASSES:
        raise ValueError(f"{source}={name!r} is not a hardware class; valid: {', '.join(CLASSES)}")
    return name


def write(path: Path, descriptions: tuple[Hardware, ...]) -> Path:
    """Write ``descriptions`` as a probe file (the format ``MIXPREC_PROBE_FILE`` reads)."""
    path.write_text(json.dumps([dataclasses.replace(hw, cached=False).to_dict() for hw in descriptions], indent=1))
    return path
