"""Precision policies as data: rules, presets, model roles, and their resolution over a model.

A :class:`Policy` says what each module stores and computes in; nothing here casts a
tensor (that is :mod:`mixprec.casting`). Presets are a pure function of the measured
hardware (:func:`mixprec.policy.presets.resolve`).
"""

from mixprec.policy.rules import CompileSettings, Policy, PolicyError, Rule
from mixprec.policy.select import ModulePlan, closest_names, iter_modules, resolve_modules

__all__ = ["CompileSettings", "Policy", "PolicyError", "Rule", "ModulePlan", "closest_names", "iter_modules", "resolve_modules"]
