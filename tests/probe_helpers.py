"""Definite machine descriptions for tests that simulate a probe."""

from __future__ import annotations


def decided(hw):
    """``hw`` with any class the probe left undecided (a busy machine) decided from its
    best calls, so that a test's description of the machine is definite and cacheable."""
    import dataclasses

    from mixprec import hardware

    dtypes = {k: (dataclasses.replace(d, klass=hardware.classify(d.ratio, d.supported)) if d.klass == hardware.UNDECIDED else d)
              for k, d in hw.dtypes.items()}
    return dataclasses.replace(hw, dtypes=dtypes)
