"""The benchmark: configurations, the plan, the worker loop, the runner, the SQLite
store, the reports and the CI gate. It measures through :mod:`mixprec.measure` and
never imports the tuner.
"""
