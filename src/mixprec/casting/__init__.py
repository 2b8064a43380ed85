"""Carrying a policy out on a model: cast, wrap, and revert bit-exactly.

:func:`~mixprec.casting.apply.apply` casts weights and installs the forward
wrappers (:mod:`~mixprec.casting.hooks`) that make dtypes meet at component and
module boundaries, fp32 compute from 16-bit weights
(:mod:`~mixprec.casting.fp32compute`), upcast attention
(:mod:`~mixprec.casting.upcast`) and ops without 16-bit kernels
(:mod:`~mixprec.casting.spectral`). What to cast is decided by :mod:`mixprec.policy`.
"""
