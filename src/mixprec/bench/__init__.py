"""Benchmark: workers, metrics, store, report and gate."""
