"""A pipeline factory that waits at a named moment, for the Ctrl-C tests (``tests/cli/test_cli_interrupts.py``).

``INTERRUPT_MARKS`` names a folder: at each moment a worker process reaches, it writes an empty file
``<moment>.<pid>`` there. At the moment ``INTERRUPT_AT`` names it then waits, for the test's
signal and for its coordinator to stop it. The moments: ``load`` (the factory builds the
pipeline), ``reference`` (a process's first fp32 run: the benchmark's or the tuner's
reference), ``16bit-1`` and ``16bit-3`` (a process's first and third run with 16-bit weights:
a configuration's warm-up and a timed run, or the tuner's first 16-bit evaluation).
"""

from __future__ import annotations

import multiprocessing
import os
import time

import torch
from torch import nn

from mixprec.pipelines import EmbeddingOutput, Pipeline

_runs = {"fp32": 0, "16bit": 0}


def _moment(name: str) -> None:
    if multiprocessing.parent_process() is None:
        return  # the command itself (checking the pipeline before the run): only its workers wait
    folder = os.environ.get("INTERRUPT_MARKS")
    if folder:
        with open(os.path.join(folder, f"{name}.{os.getpid()}"), "w"):
            pass
    if os.environ.get("INTERRUPT_AT") == name:
        time.sleep(120)  # stopped by its coordinator long before (the test checks no process is left)


class Waits(Pipeline):
    name = "waits"
    output_kind = "embedding"

    def __init__(self) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            net = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))
        super().__init__({"net": net})

    def _example_inputs(self, batch, seed):
        return torch.randn(batch, 8, generator=torch.Generator().manual_seed(seed))

    def _run(self, inputs):
        net = self.components["net"]
        dtype = next(net.parameters()).dtype  # a naive cast's: the inputs follow it
        kind = "fp32" if dtype == torch.float32 else "16bit"
        _runs[kind] += 1
        if kind == "fp32" and _runs[kind] == 1:
            _moment("reference")
        elif kind == "16bit" and _runs[kind] in (1, 3):
            _moment(f"16bit-{_runs[kind]}")
        return EmbeddingOutput(output=net(inputs.to(dtype)).float())


def build(size="default", seed=0, **_):
    _moment("load")
    return Waits()
