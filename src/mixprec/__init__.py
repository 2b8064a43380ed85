"""mixprec: safe, fast and measurable reduced-precision inference for PyTorch.

Importing mixprec changes nothing: no torch flag moves and no hardware is probed
until you ask.

Example:
    >>> import mixprec
    >>> mixprec.init(app="MYAPP")          # env, .env, TOML, defaults -> torch flags
    >>> with mixprec.numerics(matmul="high"):
    ...     ...                             # TF32 / oneDNN fast paths inside only
"""

from mixprec._init import init
from mixprec.backends import FlagReadError, Snapshot, describe, numerics, restore, snapshot
from mixprec.backends import apply_settings as apply_numerics
from mixprec.config import ConfigError, Resolved, resolve
from mixprec.settings import MATMUL_LEVELS, NumericSettings

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "FlagReadError",
    "MATMUL_LEVELS",
    "NumericSettings",
    "Resolved",
    "Snapshot",
    "apply_numerics",
    "describe",
    "init",
    "numerics",
    "resolve",
    "restore",
    "snapshot",
    "__version__",
]
