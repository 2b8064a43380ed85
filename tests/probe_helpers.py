"""Definite machine descriptions for tests that simulate a probe."""

from __future__ import annotations


def decided(hw):
    """``hw`` with any class the probe left undecided or unstable (a busy machine) decided from its
    best calls, and unstable layer figures left out, so that a test's description of the machine
    is definite and cacheable."""
    import dataclasses

    from mixprec import hardware

    unsettled = (hardware.UNDECIDED, hardware.UNSTABLE)
    dtypes = {k: (dataclasses.replace(d, klass=hardware.classify(d.ratio, d.supported), note=None) if d.klass in unsettled else d)
              for k, d in hw.dtypes.items()}
    for k, d in dtypes.items():  # a ratio load made implausible is brought within what the hardware allows
        bound = hardware.ceiling(k, hw.device_type, hw.cpu_flags, hw.capability)[0]
        if k != "fp32" and d.ratio is not None and d.ratio > bound:
            dtypes[k] = dataclasses.replace(d, ratio=bound, gflops=round(bound * (hw.dtypes["fp32"].gflops or 1.0), 2))
    layers = {dtype: {kind: info for kind, info in kinds.items() if not info.get("unstable")} for dtype, kinds in hw.layers.items()}
    return dataclasses.replace(hw, dtypes=dtypes, layers=layers)
