"""Calibration decisions remembered on disk, keyed by what makes them valid.

Like cuDNN's benchmark mode and TensorRT's timing cache, a decision timed on a model is
reused, never re-timed, while nothing it depended on changed. The key holds:

* the preset, the pipeline's hints and the quality floor;
* the model's structure: every module's qualified name and class, every parameter's and
  buffer's name, shape, dtype and device type (not the weights' values: a fine-tuned
  checkpoint of the same architecture computes the same kernels);
* the example inputs' structure: every tensor's shape, dtype and device type, and every
  other value (a step count, a prompt length) as it prints;
* the device (type, name, compute capability, CPU flags, intra-op threads);
* the torch and mixprec versions.

Each decision is one JSON file under ``calibrations/`` in the mixprec cache directory
(``MIXPREC_CACHE_DIR``); :func:`clear` removes them, ``cache=False`` on a calibration
neither reads nor writes them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from mixprec._atomic import write_text
from mixprec._version import __version__
from mixprec.device.hardware import Hardware, cache_dir

__all__ = ["key_fields", "cache_key", "lookup", "store", "clear", "entries", "folder"]

_SCHEMA = 1


def folder() -> Path:
    """Where decisions are kept: ``calibrations/`` in :func:`mixprec.device.hardware.cache_dir`."""
    return cache_dir() / "calibrations"


def _structure(components: dict[str, nn.Module]) -> str:
    digest = hashlib.sha256()
    for cname, root in components.items():
        for name, module in root.named_modules():
            digest.update(f"m {cname}.{name}:{type(module).__module__}.{type(module).__qualname__};".encode())
        for kind, named in (("p", root.named_parameters()), ("b", root.named_buffers())):
            for name, tensor in named:
                digest.update(f"{kind} {cname}.{name}:{tuple(tensor.shape)}:{tensor.dtype}:{tensor.device.type};".encode())
    return digest.hexdigest()[:16]


def _leaves(value: Any, depth: int = 0) -> Iterator[str]:
    """What of the inputs decides the work: tensors by shape, dtype and device; other values as they print."""
    if depth > 8:
        yield type(value).__name__
    elif isinstance(value, torch.Tensor):
        yield f"T{tuple(value.shape)}:{value.dtype}:{value.device.type}"
    elif isinstance(value, dict):
        for k in value:
            yield f"{k!s}="
            yield from _leaves(value[k], depth + 1)
    elif isinstance(value, (list, tuple)):
        yield "("
        for item in value:
            yield from _leaves(item, depth + 1)
        yield ")"
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        yield type(value).__name__
        for f in dataclasses.fields(value):
            yield f"{f.name}="
            yield from _leaves(getattr(value, f.name), depth + 1)
    elif value is None or isinstance(value, (bool, int, float, str)):
        yield repr(value)[:200]
    else:
        yield type(value).__name__


def inputs_signature(inputs: Any) -> str:
    """The shapes, dtypes and devices of ``inputs`` (and their other values), as one short string."""
    text = " ".join(_leaves(inputs))
    return text if len(text) <= 300 else hashlib.sha256(text.encode()).hexdigest()[:16] + f" ({text[:120]}...)"


def key_fields(preset: str, components: dict[str, nn.Module], inputs: Any, hardware: Hardware, *,
               hints: tuple[str, ...] = (), floor_db: float | None = None) -> dict[str, Any]:
    """Everything a decision depends on (see the module docstring), readable."""
    return {"schema": _SCHEMA, "preset": preset, "hints": list(hints), "floor_db": floor_db,
            "model": _structure(components), "inputs": inputs_signature(inputs),
            "device": {"type": hardware.device_type, "name": hardware.name,
                       "capability": list(hardware.capability) if hardware.capability else None,
                       "cpu_flags": list(hardware.cpu_flags), "threads": torch.get_num_threads()},
            "torch": torch.__version__, "mixprec": __version__}


def cache_key(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _path(fields: dict[str, Any]) -> Path:
    return folder() / f"{fields['preset']}-{cache_key(fields)}.json"


def lookup(fields: dict[str, Any]) -> dict[str, Any] | None:
    """The remembered decision for ``fields``, or ``None`` (none, unreadable, or its key differs)."""
    path = _path(fields)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != json.loads(json.dumps(fields, default=str)):
        return None
    return dict(record, path=str(path))


def store(fields: dict[str, Any], record: dict[str, Any]) -> Path | None:
    """Write ``record`` for ``fields`` (atomically); ``None`` where the cache directory is not writable."""
    path = _path(fields)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(dict(record, key=fields), indent=2, default=str))
    except (OSError, UnicodeError):
        return None
    return path


def entries() -> list[dict[str, Any]]:
    """Every remembered decision, newest first, each with its ``path``."""
    found = []
    for path in sorted(folder().glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            found.append(dict(record, path=str(path)))
    return sorted(found, key=lambda r: str(r.get("when", "")), reverse=True)


def clear(preset: str | None = None) -> int:
    """Remove the remembered decisions (of one preset, or all); returns how many were removed."""
    removed = 0
    pattern = f"{preset}-*.json" if preset else "*.json"
    for path in folder().glob(pattern):
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    return removed
