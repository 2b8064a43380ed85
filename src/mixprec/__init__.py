"""mixprec: safe, fast and measurable reduced-precision inference for PyTorch.

Importing mixprec changes nothing: no torch flag moves and no hardware is probed
until you ask.

Examples:
    >>> import mixprec
    >>> mixprec.init(app="MYAPP")          # env, .env, TOML, defaults -> torch flags
    >>> with mixprec.numerics(matmul="high"):
    ...     ...                             # TF32 / oneDNN fast paths inside only
    >>> with mixprec.apply(model, mixprec.preset("fast")):
    ...     ...                             # bf16 weights where the probe measured bf16 fast
    >>> with mixprec.apply(model, "fast", calibrate=(x,)):
    ...     ...                             # the preset's candidates timed on this model, the fastest kept
    >>> mixprec.tune("tts", "snr>=30").policy.save("tuned.toml")  # fastest policy meeting a bound
"""

from mixprec._version import __version__
from mixprec.device import hardware
from mixprec.policy import presets
from mixprec.casting.apply import Applied, RevertError
from mixprec.calibration import Calibration, apply, calibrate
from mixprec.casting.explain import explain, explain_warnings
from mixprec.casting.targets import ApplyError, weight_bytes
from mixprec.config.init import init
from mixprec.device.backends import FlagReadError, Snapshot, describe, numerics, restore, snapshot
from mixprec.device.backends import apply_settings as apply_numerics
from mixprec.config import ConfigError, Resolved, resolve
from mixprec.diagnose.profile import profile
from mixprec.diagnose.profile_result import Profile
from mixprec.diagnose.guard import Guard, guard
from mixprec.diagnose.fallbacks import FallbackStore, Pin
from mixprec.diagnose.overflow import NonFiniteError, NonFiniteInputError, OverflowReport
from mixprec.diagnose.dtype_errors import PrecisionDtypeError
from mixprec.tuning.bounds import Bound, parse_bound
from mixprec.tuning.result import TuneResult
from mixprec.tuning.tuner import tune
from mixprec.policy import CompileSettings, Policy, PolicyError, Rule
from mixprec.policy.presets import PRESETS, preset
from mixprec.device.settings import MATMUL_LEVELS, NumericSettings


__all__ = [
    "Calibration",
    "calibrate",
    "FallbackStore",
    "Guard",
    "NonFiniteInputError",
    "Pin",
    "PrecisionDtypeError",
    "NonFiniteError",
    "OverflowReport",
    "guard",
    "Profile",
    "profile",
    "Bound",
    "TuneResult",
    "parse_bound",
    "tune",
    "Applied",
    "ApplyError",
    "PRESETS",
    "Policy",
    "CompileSettings",
    "PolicyError",
    "RevertError",
    "Rule",
    "apply",
    "explain",
    "explain_warnings",
    "hardware",
    "preset",
    "presets",
    "weight_bytes",
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


from mixprec._surface import check_exports as _check_exports  # noqa: E402 - after everything it wraps

# every public function and class checks its arguments at the door; these first refuse an unsupported context
_check_exports(globals(), "mixprec", real_context=("apply", "calibrate", "profile", "guard"))
