"""Finding where reduced precision breaks. Nothing here times anything.

- :mod:`~mixprec.diagnose.guard`: the numerics guard, checking each call and falling
  back to a wider precision;
- :mod:`~mixprec.diagnose.overflow`: finiteness checks and the first module to overflow;
- :mod:`~mixprec.diagnose.fallbacks`: the pins the guard learned, remembered on disk;
- :mod:`~mixprec.diagnose.dtype_errors`: dtype-mismatch errors located and explained;
- :mod:`~mixprec.diagnose.profile`: every module's range, headroom and error, measured
  with :mod:`~mixprec.diagnose.capture` and :mod:`~mixprec.diagnose.low_copy`, into a
  :mod:`~mixprec.diagnose.profile_result`.
"""
