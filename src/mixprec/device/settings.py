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
from mixprec._words import describe, look_alikes, normalise

__all__ = [
    "MATMUL_LEVELS",
    "TRUE_WORDS",
    "FALSE_WORDS",
    "NumericSettings",
    "parse_matmul",
    "parse_bool",
    "did_you_mean",
    "word",
]

#: Valid values of ``torch.set_float32_matmul_precision``, most precise first.
MATMUL_LEVELS: tuple[str, ...] = ("highest", "high", "medium")

#: The words a boolean setting accepts (any case), ``true``/``false`` first.
TRUE_WORDS: tuple[str, ...] = ("true", "1", "yes", "on")
FALSE_WORDS: tuple[str, ...] = ("false", "0", "no", "off")
_BOOL_VALID = "true/false (also " + ", ".join(f"{t}/{f}" for t, f in zip(TRUE_WORDS[1:], FALSE_WORDS[1:])) + ")"


def did_you_mean(given: str, choices: list[str] | tuple[str, ...]) -> str:
    """A " (did you mean 'x'?)" suffix for the closest of ``choices``, or "".

    Compared as :func:`mixprec._words.normalise` reads words; a look-alike letter of another
    script (a Cyrillic ``і``) is named with the Latin letter it resembles."""
    folded = normalise(str(given))
    close = difflib.get_close_matches(folded, [normalise(c) for c in choices], n=1, cutoff=0.6)
    if not close:
        return ""
    original = next(c for c in choices if normalise(c) == close[0])
    alike = "; ".join(f"{describe(c)} looks like {latin!r}" for c, latin in look_alikes(str(given))[:3])
    return f" (did you mean '{original}'?{' ' + alike if alike else ''})"


def word(value: Any, valid: tuple[str, ...] | list[str], what: str) -> str:
    """``value`` read as one of ``valid`` (lower-case words): normalised as every source's words are
    (:func:`mixprec._words.normalise`: invisible characters and surrounding whitespace of any kind
    removed, NFKC, case-folded).

    Raises:
        ValueError: ``what`` (``"invalid value"``), the value, the look-alike characters it holds, and the valid values.
    """
    if not isinstance(value, str):
        raise ValueError(f"expected a string, one of: {', '.join(valid)}; got {type(value).__name__} {quote(value)}")
    folded = normalise(value)
    if folded in valid:
        return folded
    alike = look_alikes(value)
    why = (f": it holds {', '.join(f'{describe(c)}, which looks like {latin!r}' for c, latin in alike[:3])}"
           if alike else did_you_mean(folded, valid))
    raise ValueError(f"{what} {quote(value)}{why}; valid values: {', '.join(valid)}")


def parse_matmul(value: Any) -> str:
    """Parse a float32 matmul precision level, case-insensitively.

    Raises:
        ValueError: for anything but ``highest``, ``high`` or ``medium``.
    """
    return word(value, MATMUL_LEVELS, "invalid value")


def parse_bool(value: Any) -> bool:
    """Parse a boolean flag from a bool or a string such as ``on``/``off``.

    Raises:
        ValueError: for anything else (integers included, to catch typos in files).
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        folded = normalise(value)
        if folded in TRUE_WORDS:
            return True
        if folded in FALSE_WORDS:
            return False
        alike = look_alikes(value)
        if alike:
            valid = _BOOL_VALID
            raise ValueError(f"invalid value {quote(value)}: it holds "
                             f"{', '.join(f'{describe(c)}, which looks like {latin!r}' for c, latin in alike[:3])}; "
                             f"valid values: {valid}")
    valid = _BOOL_VALID
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
    read as every source's words are: case-insensitively, with surrounding whitespace of
    any kind and invisible characters ignored (:func:`mixprec._words.normalise`).

    Examples:
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
