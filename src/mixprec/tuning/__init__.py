"""The autotuner: the fastest policy meeting a quality bound, in few measured evaluations.

:mod:`~mixprec.tuning.search` holds the search (group testing over the module tree,
local moves, the frontier) and the worker side of an evaluation;
:mod:`~mixprec.tuning.tuner` holds :func:`~mixprec.tuning.tuner.tune`, bounds,
held-out validation and the result. It measures through :mod:`mixprec.measure`,
never through the benchmark. (Named ``tuning`` so that ``mixprec.tune`` stays the function.)
"""
