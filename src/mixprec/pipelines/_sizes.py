"""What each size of a pipeline is for and what it needs, counted without allocating weights.

A pipeline module may name its sizes in ``SIZES`` (a mapping of size -> config, or a
sequence of names) and say what each is for in ``SIZE_NOTES`` (size -> text).
:func:`build_for_counting` builds a pipeline on PyTorch's ``meta`` device, where
parameters have shapes but no storage, so a GPU-sized pipeline is counted in
seconds on any machine; a factory that cannot build there is built for real.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from mixprec.pipelines._base import Pipeline
from mixprec.pipelines._registry import _lookup, get

__all__ = ["FP32_BYTES", "build_for_counting", "build_on_meta", "describe_sizes", "size_notes"]

#: Bytes per parameter in float32.
FP32_BYTES = 4


def build_on_meta(name: str, *, size: str = "default", seed: int = 0, **overrides: Any) -> Pipeline:
    """Build pipeline ``name`` on the ``meta`` device: every shape, no weight memory.

    Raises:
        Whatever the factory raises there (an unknown size, a factory that loads
        files and cannot build on ``meta``).
    """
    with torch.device("meta"):
        return get(name, size=size, seed=seed, device="meta", **overrides)


def build_for_counting(name: str, *, size: str = "default", seed: int = 0) -> Pipeline:
    """Pipeline ``name`` at ``size`` to count its parameters: built on the ``meta`` device
    where its factory builds there, else built for real (as ``mixprec pipelines`` always did).

    Raises:
        Whatever the real build raises (an unknown size or option).
    """
    try:
        return build_on_meta(name, size=size, seed=seed)
    except Exception:  # a factory that refuses meta tensors (or an unknown size, which the real build reports)
        return get(name, size=size, seed=seed)


def size_notes(name: str) -> dict[str, str]:
    """Size -> what it is for, in the order the pipeline's module lists its sizes.

    Read from the module of the pipeline's factory: ``SIZE_NOTES``, else the names in
    ``SIZES`` (with empty notes), else ``{"default": ""}``.
    """
    try:
        module = inspect.getmodule(_lookup(name))
    except Exception:  # a pipeline that cannot even be looked up has its one default size
        module = None
    notes = getattr(module, "SIZE_NOTES", None)
    sizes = getattr(module, "SIZES", None)
    names: list[str] = []
    if isinstance(sizes, Mapping) or isinstance(sizes, (list, tuple)):
        names = [str(s) for s in sizes]
    if isinstance(notes, Mapping):
        names += [str(s) for s in notes if str(s) not in names]
    else:
        notes = {}
    return {size: str(notes.get(size, "")) for size in names or ["default"]}


def describe_sizes(name: str) -> dict[str, dict[str, Any]]:
    """Every size of pipeline ``name``: what it is for and what its weights need.

    Returns:
        Size -> ``{"purpose", "parameters", "fp32_weight_bytes"}`` (parameters
        counted on the ``meta`` device, see :func:`build_for_counting`), or
        ``{"purpose", "error"}`` where the pipeline cannot be built at that size.
    """
    out: dict[str, dict[str, Any]] = {}
    for size, purpose in size_notes(name).items():
        try:
            counts = build_for_counting(name, size=size).parameter_counts()
        except Exception as exc:  # list every size, even one that cannot be built
            out[size] = {"purpose": purpose, "error": f"{type(exc).__name__}: {exc}"}
            continue
        total = counts["total"]
        out[size] = {"purpose": purpose, "parameters": total, "fp32_weight_bytes": FP32_BYTES * total}
    return out
