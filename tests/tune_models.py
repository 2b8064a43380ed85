"""Synthetic models for the autotuner: where their sensitivity to 16-bit weights shows.

``model("layer")``: 64 residual blocks, 3 of them (7, 30, 51) hold a layer whose own
error in bf16 is large (a weight offset that cancels only in fp32): the per-layer
profile points at it.

``model("block")``: the same 3 blocks instead hold two layers with nearly equal
weights whose outputs are subtracted; each layer's own error is ordinary bf16
rounding, only the block's output (the small difference, amplified) is wrong. A
per-layer profile ranks every layer alike; the block-level profile shows it.

``model("both")``: block 7 as in ``layer``, blocks 30 and 51 as in ``block``.

``small(kind)``: the same, 16 blocks with the sensitive ones at :data:`SMALL_SENSITIVE`: for
the tests of the search's logic. Per block the errors are those of the 64-block model (the
search takes the same steps, the sensitive blocks fail the bound by the same margins); the
cost of applying a policy and of a run grows with the blocks.

``gated()``: 8 blocks, one of which only does anything for inputs of large magnitude
(``shifted_inputs(seed)`` for seeds >= 2): its sensitivity never shows on seeds 0 and 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

N_BLOCKS = 64
SENSITIVE = (7, 30, 51)
WIDTH = 32
SMALL_BLOCKS = 16
SMALL_SENSITIVE = (2, 7, 12)


class CenteredLinear(nn.Linear):
    """A Linear that centres its input: its large constant weight offset cancels in fp32 only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x - x.mean(-1, keepdim=True), self.weight, self.bias)


class LayerBlock(nn.Module):
    """``x + fc2(relu(fc1(x)))``; when sensitive, ``fc2`` alone is (per-layer sensitivity)."""

    def __init__(self, width: int, sensitive: bool):
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = (CenteredLinear if sensitive else nn.Linear)(2 * width, width)
        with torch.no_grad():
            self.fc2.weight.mul_(0.3)
            if sensitive:  # +64 on every weight: exact no-op on centred input, ~2**-3 rounding noise in bf16
                self.fc2.weight.add_(64.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class CancelBlock(nn.Module):
    """``x + gain * (a(x) - b(x))``; when sensitive, ``b`` is ``a`` plus a tiny change and
    the gain large: each layer rounds like any other, their difference does not survive."""

    def __init__(self, width: int, sensitive: bool):
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)
        with torch.no_grad():
            if sensitive:
                self.b.weight.copy_(self.a.weight + 1e-3 * torch.randn_like(self.a.weight) / width ** 0.5)
                self.b.bias.copy_(self.a.bias)
        self.gain = 300.0 if sensitive else 0.3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gain * (self.a(x) - self.b(x))


class GatedBlock(CancelBlock):
    """A sensitive :class:`CancelBlock` that acts only on inputs whose RMS exceeds 2."""

    def __init__(self, width: int):
        super().__init__(width, True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = (x.pow(2).mean(-1, keepdim=True).sqrt() > 2.0).to(x.dtype)
        return x + gate * self.gain * (self.a(x) - self.b(x))


def model(kind: str, n_blocks: int = N_BLOCKS, sensitive: tuple[int, ...] = SENSITIVE) -> nn.Sequential:
    """``layer``, ``block`` or ``both`` (see the module docstring), in eval mode, seeded."""
    torch.manual_seed(0)
    blocks = []
    for i in range(n_blocks):
        hit = i in sensitive
        if kind == "layer" or (kind == "both" and i == sensitive[0]):
            blocks.append(LayerBlock(WIDTH, hit))
        elif kind in ("block", "both"):
            blocks.append(CancelBlock(WIDTH, hit) if hit else LayerBlock(WIDTH, False))
        else:
            raise ValueError(f"unknown kind {kind!r}; valid: layer, block, both")
    return nn.Sequential(*blocks).eval()


def small(kind: str) -> nn.Sequential:
    """:func:`model` with :data:`SMALL_BLOCKS` blocks, sensitive at :data:`SMALL_SENSITIVE`."""
    return model(kind, SMALL_BLOCKS, SMALL_SENSITIVE)


def gated() -> nn.Sequential:
    """8 ordinary blocks with a :class:`GatedBlock` at position 3."""
    torch.manual_seed(0)
    return nn.Sequential(*[GatedBlock(WIDTH) if i == 3 else LayerBlock(WIDTH, False) for i in range(8)]).eval()


def inputs(seed: int) -> torch.Tensor:
    """A (4, 32) standard normal batch."""
    return torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(seed))


def shifted_inputs(seed: int) -> torch.Tensor:
    """:func:`inputs`, scaled by 3 from seed 2 on: what opens :class:`GatedBlock`."""
    return inputs(seed) * (3.0 if seed >= 2 else 1.0)
