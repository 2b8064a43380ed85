"""The autotuner: the fastest policy meeting a quality bound, in few measured evaluations.

From the bottom up: :mod:`~mixprec.tuning.bounds` (quality bounds, the metrics they read,
the worst case over seeds); :mod:`~mixprec.tuning.session` (measuring one target in one
process, and :func:`~mixprec.tuning.session.serve_tune`, the worker side);
:mod:`~mixprec.tuning.group_testing` (minimal keep-fp32 sets, down the module tree);
:mod:`~mixprec.tuning.candidates` (configurations, evaluations, candidates, the frontier);
:mod:`~mixprec.tuning.evaluators` (the evaluator protocol, in-process and worker
evaluators); :mod:`~mixprec.tuning.progress` (what a run does now, how far it is, and
estimates from measured durations); :mod:`~mixprec.tuning.search` (the memoised, budgeted
search and its moves); :mod:`~mixprec.tuning.retiming` (the finalists re-timed side by side);
:mod:`~mixprec.tuning.validation` (held-out validation seeds and the check on them);
:mod:`~mixprec.tuning.result` (:class:`~mixprec.tuning.result.TuneResult`);
:mod:`~mixprec.tuning.report` (its plot, validation sentence and HTML page); and on top
:mod:`~mixprec.tuning.tuner` (:func:`~mixprec.tuning.tuner.tune`, which ties them
together). It measures through :mod:`mixprec.measure`, never through the benchmark.
(Named ``tuning`` so that ``mixprec.tune`` stays the function.)
"""
