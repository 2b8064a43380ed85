"""The guard's memory of fallbacks: which modules it pinned wider and why (:class:`Pin`),
kept on disk (:class:`FallbackStore`) under a fingerprint of the model and the hardware.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from mixprec._atomic import write_text
from mixprec.casting.apply import Applied
from mixprec.casting.kinds import sample
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
            layout = "" if t.layout == torch.strided else f":{t.layout}"
            h.update(f"{key}:{tuple(t.shape)}:{t.dtype}{layout}".encode())
            h.update(sample(t).numpy().tobytes())  # every kind: sparse, quantized, complex, meta, subclasses
    return h.hexdigest()[:24]


class FallbackStore:
    """Remembered fallbacks: ``{fingerprint: {"pins": {module: dtype}, ...}}`` in a JSON file.

    Several processes may remember at once (a server's workers, a benchmark's): every
    change takes an exclusive lock on ``<file>.lock``, reads the file afresh, and replaces
    it atomically (a temporary file in the same folder, then ``os.replace``), so no
    process loses another's pins and no reader sees half a file. A file that is not JSON,
    or not a JSON object of fingerprints, is ignored with a warning that says what it
    held, and the next change keeps a copy of it as ``<file>.invalid`` before writing.
    """

    #: How long a change waits for another process's lock before giving up (seconds).
    LOCK_TIMEOUT = 30.0

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else cache_dir() / "fallbacks.json"

    def load(self) -> dict[str, Any]:
        """The remembered entries; ``{}`` (with a warning) when the file is unreadable or of the wrong shape."""
        data, _ = self._read()
        return data

    def _read(self) -> tuple[dict[str, Any], bool]:
        """(valid entries, whether the file exists but is not a store at all)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}, False
        except UnicodeDecodeError as exc:
            warnings.warn(f"ignoring fallback store {self.path}: not UTF-8 text (byte {exc.start} is "
                          f"{exc.object[exc.start]:#04x}); delete it, or run 'mixprec fallbacks clear' to start "
                          "an empty one", stacklevel=3)
            return {}, True
        except OSError as exc:
            warnings.warn(f"ignoring unreadable fallback store {self.path}: {exc}", stacklevel=3)
            return {}, False
        try:
            raw = json.loads(text)
        except ValueError as exc:
            warnings.warn(f"ignoring fallback store {self.path}: not JSON ({exc}); delete it, or run "
                          "'mixprec fallbacks clear' to start an empty one", stacklevel=3)
            return {}, True
        if not isinstance(raw, dict):
            warnings.warn(f"ignoring fallback store {self.path}: expected a JSON object of fingerprint -> "
                          f"{{\"pins\": {{module: dtype}}, ...}}, found a JSON {_json_kind(raw)}; delete it, or run "
                          "'mixprec fallbacks clear' to start an empty one", stacklevel=3)
            return {}, True
        data, bad = {}, []
        for key, entry in raw.items():
            pins = entry.get("pins") if isinstance(entry, dict) else None
            if (isinstance(pins, dict) and all(isinstance(m, str) and isinstance(d, str) for m, d in pins.items())
                    and all(isinstance(entry.get(k, {}), dict) for k in ("learned", "reasons"))):
                data[key] = entry
            else:
                bad.append(key)
        if bad:
            warnings.warn(f"ignoring {len(bad)} malformed entr{'y' if len(bad) == 1 else 'ies'} in fallback store {self.path} "
                          f"({', '.join(map(repr, bad[:3]))}{', ...' if len(bad) > 3 else ''}): each must be an object with "
                          "\"pins\": {module: dtype}", stacklevel=3)
        return data, False

    def get(self, key: str) -> dict[str, str]:
        return dict(self.entry(key).get("pins", {}))

    def entry(self, key: str) -> dict[str, Any]:
        """The whole record of one fingerprint: ``pins``, ``learned`` and ``reasons`` per module, ``model``, ``updated``."""
        return dict(self.load().get(key, {}))

    def remember(self, key: str, module: str, dtype: str, description: str, reason: str = "") -> None:
        """Add one pin under ``key``.

        Raises:
            OSError: the file or its lock cannot be written (a read-only folder), or another
                process held the lock for :attr:`LOCK_TIMEOUT` seconds.
        """
        with self._locked() as data:
            now = time.strftime("%Y-%m-%d %H:%M:%S")
            entry = data.setdefault(key, {"pins": {}, "model": description})
            entry["pins"][module] = dtype
            entry.setdefault("learned", {})[module] = now
            if reason:
                entry.setdefault("reasons", {})[module] = reason
            entry["updated"] = now

    def clear(self, key: str | None = None) -> int:
        """Forget one fingerprint's pins, or all; returns how many entries were removed."""
        if not self.path.exists():
            return 0
        with self._locked() as data:
            if key is None:
                removed = len(data)
                data.clear()
            else:
                removed = int(data.pop(key, None) is not None)
        return removed

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        """Read the file under the lock, let the caller change it, then replace it atomically."""
        import filelock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(str(self.path) + ".lock", timeout=self.LOCK_TIMEOUT)
        try:
            lock.acquire()
        except filelock.Timeout as exc:
            raise OSError(f"another process has held the lock {lock.lock_file} for {self.LOCK_TIMEOUT:g} s") from exc
        try:
            data, invalid = self._read()
            yield data
            if invalid:
                shutil.copyfile(self.path, str(self.path) + ".invalid")
            write_text(self.path, json.dumps(data, indent=2, sort_keys=True),
                       mode=None if self.path.exists() else 0o644)
        finally:
            lock.release()


def _json_kind(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


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
