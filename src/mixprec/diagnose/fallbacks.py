"""The guard's memory of fallbacks: which modules it pinned wider and why (:class:`Pin`),
kept on disk (:class:`FallbackStore`) under a fingerprint of the model and the hardware.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mixprec.casting.apply import Applied
from mixprec.device.hardware import Hardware, cache_dir
from mixprec.policy import iter_modules

__all__ = ["FallbackStore", "Pin", "fingerprint"]


def fingerprint(applied: Applied, hardware: Hardware) -> str:
    """Hash of the model structure, its original weights (sampled) and the hardware."""
    h = hashlib.sha256()
    h.update(json.dumps([hardware.device_type, hardware.name, hardware.torch_version]).encode())
    originals = applied.original_tensors()
    for qualname, module in iter_modules(applied.components):
        h.update(f"{qualname}:{type(module).__name__}".encode())
        for key, t in list(module._parameters.items()) + list(module._buffers.items()):
            if t is None:
                continue
            t = originals.get(id(t), t)
            h.update(f"{key}:{tuple(t.shape)}:{t.dtype}".encode())
            if t.numel():
                flat = t.detach().reshape(-1)
                step = max(1, flat.numel() // 64)
                h.update(flat[::step][:64].to("cpu", torch.float64).numpy().tobytes())
    return h.hexdigest()[:24]


class FallbackStore:
    """Remembered fallbacks: ``{fingerprint: {"pins": {module: dtype}, ...}}`` in a JSON file."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else cache_dir() / "fallbacks.json"

    def load(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            warnings.warn(f"ignoring unreadable fallback store {self.path}: {exc}", stacklevel=2)
            return {}

    def get(self, key: str) -> dict[str, str]:
        return dict(self.entry(key).get("pins", {}))

    def entry(self, key: str) -> dict[str, Any]:
        """The whole record of one fingerprint: ``pins``, ``learned`` and ``reasons`` per module, ``model``, ``updated``."""
        return dict(self.load().get(key, {}))

    def remember(self, key: str, module: str, dtype: str, description: str, reason: str = "") -> None:
        data = self.load()
        now = time.strftime("%Y-%m-%d %H:%M:%S")
        entry = data.setdefault(key, {"pins": {}, "model": description})
        entry["pins"][module] = dtype
        entry.setdefault("learned", {})[module] = now
        if reason:
            entry.setdefault("reasons", {})[module] = reason
        entry["updated"] = now
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        tmp.replace(self.path)

    def clear(self, key: str | None = None) -> int:
        """Forget one fingerprint's pins, or all; returns how many entries were removed."""
        data = self.load()
        if key is None:
            removed = len(data)
            data = {}
        else:
            removed = int(data.pop(key, None) is not None)
        if self.path.exists():
            self.path.write_text(json.dumps(data, indent=2, sort_keys=True))
        return removed


@dataclass(frozen=True)
class Pin:
    """A module the guard pinned wider, and why.

    Attributes:
        module: qualified name.
        dtype: the storage dtype it was pinned to, or ``fp32-output`` when only what it
            hands back was widened (it still computes in its own dtype).
        source: ``fallback`` (learned in this process) or ``remembered`` (from the store).
        learned: when the fallback was first learned (``YYYY-mm-dd HH:MM:SS``).
        reason: what made it necessary.
    """

    module: str
    dtype: str
    source: str
    learned: str
    reason: str = ""
