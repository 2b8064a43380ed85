"""Carrying a policy out on a model: cast, wrap, and revert bit-exactly.

:func:`~mixprec.casting.apply.apply` casts weights, keeps the originals and reverts
(:mod:`~mixprec.casting.apply`) on the components of a target
(:mod:`~mixprec.casting.targets`). :mod:`~mixprec.casting.install` decides where the
forward wrappers (:mod:`~mixprec.casting.hooks`) go that make dtypes meet at component
and module boundaries, fp32 compute from 16-bit weights
(:mod:`~mixprec.casting.fp32compute`), upcast attention
(:mod:`~mixprec.casting.upcast`) and ops without 16-bit kernels
(:mod:`~mixprec.casting.spectral`); :mod:`~mixprec.casting.compile` compiles the
components a policy asks for, :mod:`~mixprec.casting.caches` puts back the tensors a
model cached as plain attributes during the applied run, and
:mod:`~mixprec.casting.explain` tells what a policy does to each module. What to cast is
decided by :mod:`mixprec.policy`.
"""
