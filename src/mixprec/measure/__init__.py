"""How things are measured, for the benchmark and the tuner alike: quality metrics and
latency statistics, isolated worker processes behind a small executor interface,
memory readings and the machine's fingerprint. Knows neither the benchmark nor the tuner.
"""
