"""Pipeline factories for the tests of the commands and the benchmark runner (statuses, crashes, time
limits, what a command says), not of what a model computes.

A worker that builds one of these imports nothing beyond torch and mixprec (a model library's
import costs a worker seconds), and its runs take no time worth counting, so a test that starts
many workers pays for the workers alone.

* ``build``: an 8 -> 4 embedding network (two ``Linear`` layers), built and run in well under a
  millisecond.
* ``slow``: the same network behind 2000 more ``Linear``/``Tanh`` layers, one module call each: a run
  is at least 4000 Python module calls (tens of milliseconds here, several on the fastest machine), so a time limit of
  a millisecond is always exceeded, whatever the machine's speed or load.
"""

from __future__ import annotations

import torch
from torch import nn

from mixprec.pipelines import EmbeddingOutput, Pipeline

#: The ``slow`` network's extra ``Linear``/``Tanh`` pairs.
SLOW_LAYERS = 2000


class Small(Pipeline):
    name = "small"
    output_kind = "embedding"

    def __init__(self, extra_layers: int = 0) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            extra = [m for _ in range(extra_layers) for m in (nn.Linear(8, 8), nn.Tanh())]
            net = nn.Sequential(*extra, nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))
        super().__init__({"net": net})

    def _example_inputs(self, batch, seed):
        return torch.randn(batch, 8, generator=torch.Generator().manual_seed(seed))

    def _run(self, inputs):
        net = self.components["net"]
        return EmbeddingOutput(output=net(inputs.to(next(net.parameters()).dtype)).float())


def build(size="test", seed=0, device="cpu", **_):
    return Small()


def slow(size="test", seed=0, device="cpu", **_):
    return Small(SLOW_LAYERS)
