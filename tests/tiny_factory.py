"""The smallest pipeline factory, as a file a test writes for the CLI to load (``f.py:build``)."""

from __future__ import annotations

_SOURCE = '''
import torch
from torch import nn
from mixprec.pipelines import EmbeddingOutput, Pipeline


class Tiny(Pipeline):
    name = "tiny"
    output_kind = "embedding"

    def __init__(self):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            net = nn.Sequential(nn.Linear(8, 8), {middle}, nn.Linear(8, 4))
        super().__init__({"net": net})

    def _example_inputs(self, batch, seed):
        return torch.randn(batch, 8, generator=torch.Generator().manual_seed(seed))

    def _run(self, inputs):
        return EmbeddingOutput(output=self.components["net"](inputs).float())


def build(size="default", seed=0):
    return Tiny()
'''


def tiny_factory_source(middle: str = "nn.GELU()") -> str:
    """Source of a factory module whose ``build`` returns an 8 -> 4 embedding pipeline,
    ``middle`` (Python source of a module) between its two Linear layers."""
    return _SOURCE.replace("{middle}", middle)
