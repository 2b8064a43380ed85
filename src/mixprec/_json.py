"""Standard JSON for figures that may be infinite or NaN: written ``"inf"``, ``"-inf"``, ``"nan"``
(as mixprec's exports, ``compare --json`` and stored tune results write them), read back as floats."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["strict", "number"]


def strict(value: Any) -> Any:
    """``value`` with every non-finite float as a string and every mapping key as a string (recursively)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def number(value: Any) -> Any:
    """A figure :func:`strict` wrote as a string, as the float it was; anything else as it is."""
    return float(value) if value in ("inf", "-inf", "nan") else value
