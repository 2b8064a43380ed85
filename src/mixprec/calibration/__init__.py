"""Presets checked on the user's own model: measured like cuDNN's benchmark mode, remembered.

A preset resolved from the probe is a prediction from a 512³ matmul and a few layer
kinds; what the model does on its device can differ. :func:`calibrate` times the preset's
candidates on the model itself (:mod:`~mixprec.calibration.candidates`: the rule-based
resolution, the other 16-bit type, fp32 at the preset's matmul level, the preset without
its extras and the one-line casts it must not lose to), in paired rounds of CPU time
(CUDA events on a GPU), checks each against fp32's output on the same inputs, and keeps
the fastest that meets the preset's quality floor (:mod:`~mixprec.calibration.decide`).
A model of several components is calibrated per component
(:mod:`~mixprec.calibration.components`, recorded by :mod:`~mixprec.calibration.record`):
each component timed alone on its own recorded calls, the choices composed and checked end
to end. The decision is remembered on disk (:mod:`~mixprec.calibration.cache`), keyed by the
model's structure, the inputs' shapes, the device and the versions.

It sits above :mod:`mixprec.measure` (statistics, metrics) and below the benchmark and the
tuner, which show and reuse its decisions.

Examples:
    >>> with mixprec.apply(model, "fast", calibrate=(input_ids,)) as applied:
    ...     print(applied.calibration.headline())
"""

from mixprec.calibration import cache
from mixprec.calibration.calibrate import FLOORS_DB, MAX_ROUNDS, TIME_LIMIT_S, apply, calibrate
from mixprec.calibration.result import Calibration
from mixprec.calibration.candidates import Candidate, candidates
from mixprec.calibration.cache import clear, entries

__all__ = ["Calibration", "Candidate", "FLOORS_DB", "MAX_ROUNDS", "TIME_LIMIT_S", "apply", "cache", "calibrate",
           "candidates", "clear", "entries"]
