"""What the test suite computes in 16-bit floating point, counted (tests/_flops16.py).

:mod:`flops16_count` holds the counting dispatch mode, :mod:`flops16_budget` the report and
the budget; ``sitecustomize`` counts a Python subprocess a test starts (a benchmark worker)
where the plugin puts this folder on its ``PYTHONPATH``.
"""
