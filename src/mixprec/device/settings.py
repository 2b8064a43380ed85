"""Global numeric settings: the data and the parsing of their values.

Nothing here touches torch; :mod:`mixprec.device.backends` writes these settings,
:mod:`mixprec.config.options` lists how each source spells them and
:mod:`mixprec.config` resolves them from their sources.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

from mixprec._quote import quote

__all__ = [
    "MATMUL_LEVELS",
    "NumericSettings",
    "parse_matmul",
    "parse_bool",
    "did_you_mean",
]

#: Valid values of ``torch.set_float32_matmul_precision``, most precise first.
MATMUL_LEVELS: tuple[str, ...] = ("highest", "high", "medium")

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """A " (did you mean 'x'?)" suffix for the closest of ``choices``, or ""."""
    close = difflib.get_close_matches(str(word).lower(), [c.lower() for c in choices], n=1, cutoff=0.6)
    if not close:
        return ""
    original = next(c for c in choices if c.lower() == close[0])
    return f" (did you mean '{original}'?)"


def parse_matmul(value: Any) -> str:
    """Parse a float32 matmul precision level, case-insensitively.

    Raises:
        ValueError: for anything but ``highest``, ``high`` or ``medium``.
    """
    if not isinstance(value, str):
        raise ValueError(f"expected a string, one of: {', '.join(MATMUL_LEVELS)}; got {type(value).__name__} {quote(value)}")
    level = value.strip().lower()
    if level not in MATMUL_LEVELS:
        raise ValueError(f"invalid value {quote(value)}{did_you_mean(level, MATMUL_LEVELS)}; valid values: {', '.join(MATMUL_LEVELS)}")
    return level


def parse_bool(value: Any) -> bool:
    """Parse a boolean flag from a bool or a string such as ``on``/``off``.

    Raises:
        ValueError: for anything else (integers included, to catch typos in files).
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    valid = "true/false (also 1/0, yes/no, on/off)"
    raise ValueError(f"invalid value {quote(value)}; valid values: {valid}")


@dataclass(frozen=True)
class NumericSettings:
    """Process-wide float32 numerics, with the semantics of the torch flags they map to.

    Attributes:
        matmul: ``highest`` (full fp32), ``high`` (TF32 on CUDA, TF32 in oneDNN where
            the CPU has it) or ``medium`` (also bf16 internally in oneDNN matmuls on CPU),
            as ``torch.set_float32_matmul_precision``.
        conv_tf32: allow TF32 in cuDNN convolutions (``torch.backends.cudnn.allow_tf32``,
            which also covers cuDNN RNNs).
        fp16_reduced_precision_reduction: allow reduced-precision reductions in fp16
            CUDA matmuls.
        bf16_reduced_precision_reduction: the same for bf16.

    The defaults are torch's own defaults. Strings are accepted for every field and
    parsed case-insensitively with surrounding whitespace ignored.

    Example:
        >>> NumericSettings(matmul=" HIGH ").matmul
        'high'
    """

    matmul: str = "highest"
    conv_tf32: bool = True
    fp16_reduced_precision_reduction: bool = True
    bf16_reduced_precision_reduction: bool = True
    version: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "matmul", parse_matmul(self.matmul))
        for name in ("conv_tf32", "fp16_reduced_precision_reduction", "bf16_reduced_precision_reduction"):
            object.__setattr__(self, name, parse_bool(getattr(self, name)))
        if self.version != 1:
            raise ValueError(f"unsupported NumericSettings version {self.version!r}; this mixprec reads version 1")

    def replace(self, **changes: Any) -> NumericSettings:
        """A copy with ``changes`` applied (and parsed)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NumericSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            key = unknown[0]
            raise ValueError(f"unknown NumericSettings key {key!r}{did_you_mean(key, sorted(known))}; valid keys: {', '.join(sorted(known))}")
        return cls(**data)
