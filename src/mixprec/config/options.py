"""The table of configurable options: how each source spells a setting and how its
value is parsed. Numeric options feed :class:`~mixprec.device.settings.NumericSettings`;
``preset`` and ``policy`` name a policy, which is why configuration sits above
:mod:`mixprec.policy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from mixprec._quote import quote
from mixprec.device.settings import MATMUL_LEVELS, NumericSettings, parse_bool, parse_matmul, word
from mixprec.policy import Policy
from mixprec.policy.presets import PRESETS

__all__ = ["Option", "OPTIONS", "option_for_key", "default_value", "parse_preset", "parse_policy_file"]


def parse_preset(value: Any) -> str:
    """Parse a preset name as every source's words are read (case, surrounding and invisible
    characters ignored: :func:`mixprec.device.settings.word`)."""
    return word(value, PRESETS, "unknown preset")


def parse_policy_file(value: Any) -> str:
    """Check that a policy file exists and parses; returns its path."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected the path of a policy .toml or .json file, got {quote(value)}")
    Policy.load(value.strip())  # raises PolicyError (a ValueError) naming the file and key
    return value.strip()


@dataclass(frozen=True)
class Option:
    """One configurable setting and how each source spells it.

    Attributes:
        key: the name in config files (``[tool.mixprec]``, ``mixprec.toml``).
        env: the environment-variable suffix (after ``MIXPREC_`` or the app prefix).
        label: the human name used in logs and tables.
        parse: turns a raw value into a valid one or raises ``ValueError``.
        valid: the valid values, in words.
        field: the ``NumericSettings`` field it feeds, if any.
        is_path: the value is a path (a relative one in a settings file is read from
            that file's folder); any other value is a word from a fixed set, so a
            non-ASCII character in it (a Cyrillic ``і`` in ``hіgh``) is refused.
    """

    key: str
    env: str
    label: str
    parse: Callable[[Any], Any]
    valid: str
    field: str | None = None
    is_path: bool = False

    @property
    def ascii_only(self) -> bool:
        return not self.is_path

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")


OPTIONS: tuple[Option, ...] = (
    Option("float32_matmul_precision", "FLOAT32_MATMUL_PRECISION", "float32 matmul precision",
           parse_matmul, ", ".join(MATMUL_LEVELS), field="matmul"),
    Option("conv_tf32", "CONV_TF32", "cuDNN conv TF32", parse_bool, "true/false", field="conv_tf32"),
    Option("fp16_reduced_precision_reduction", "FP16_REDUCED_PRECISION_REDUCTION",
           "fp16 reduced-precision reduction", parse_bool, "true/false", field="fp16_reduced_precision_reduction"),
    Option("bf16_reduced_precision_reduction", "BF16_REDUCED_PRECISION_REDUCTION",
           "bf16 reduced-precision reduction", parse_bool, "true/false", field="bf16_reduced_precision_reduction"),
    Option("preset", "PRESET", "precision preset", parse_preset, ", ".join(PRESETS)),
    Option("policy", "POLICY", "policy file", parse_policy_file, "path of a policy .toml or .json file",
           is_path=True),
)

_DEFAULTS = NumericSettings()


def option_for_key(key: str) -> Option | None:
    return next((o for o in OPTIONS if o.key == key), None)


def default_value(option: Option) -> Any:
    return getattr(_DEFAULTS, option.field) if option.field else None
