"""Which machine and software a measurement was taken on: its fingerprint and versions.

Ratios are only compared between runs with the same fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import platform
from importlib.metadata import PackageNotFoundError, version

import torch

from mixprec._version import __version__
from mixprec.device.hardware import Hardware

__all__ = ["machine_fingerprint", "versions"]


def machine_fingerprint(hw: Hardware) -> str:
    """A short hash of what makes timings comparable: device, CPU flags, threads, torch."""
    raw = json.dumps([hw.device_type, hw.name, list(hw.cpu_flags), hw.threads, hw.capability, hw.torch_version])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version(), "mixprec": __version__, "torch": torch.__version__}
    for dist in ("transformers", "diffusers"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out
