"""Test models for the numerics guard, in the style of ACE-Step's lyric encoder."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GatedProjection(nn.Module):
    """A gated MLP projection computed from its own weights.

    With a large ``up`` weight its intermediate reaches |x| ~ 5e5 (beyond fp16's 65,504)
    while its output, scaled down by ``down``, stays in range: pinning this one module
    to a wider dtype is enough.
    """

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up = nn.Parameter(torch.randn(hidden, dim) / dim**0.5)
        self.gate = nn.Parameter(torch.randn(hidden, dim) / dim**0.5)
        self.down = nn.Parameter(torch.randn(dim, hidden) / hidden**0.5)

    def forward(self, x):
        return F.linear(F.linear(x, self.up) * torch.sigmoid(F.linear(x, self.gate)), self.down)


class LyricBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.mlp = GatedProjection(dim, 4 * dim)

    def forward(self, x):
        h = self.norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm(x))


class LyricEncoder(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32, depth: int = 4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(LyricBlock(dim) for _ in range(depth))
        self.out = nn.LayerNorm(dim)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def overflowing_lyric_encoder(seed: int = 0) -> LyricEncoder:
    """Block 2's projection reaches about 5e5 inside; everything else is ordinary."""
    torch.manual_seed(seed)
    model = LyricEncoder().eval()
    with torch.no_grad():
        mlp = model.blocks[2].mlp
        mlp.up.mul_(1.5e5)
        mlp.down.div_(1.5e5)
    return model


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(seed))


class OverflowingMLP(nn.Module):
    """Its first layer reaches 8e4 (inf in fp16); the result is scaled back into range."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(4, 8)
        self.down = nn.Linear(8, 4)
        with torch.no_grad():
            self.up.weight.fill_(2e4)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)) * 1e-3)


class KeywordOnlyMLP(OverflowingMLP):
    """The same, called only with keyword arguments (``m(x=x)``)."""

    def forward(self, *, x):
        return super().forward(x)


class MixedCallMLP(OverflowingMLP):
    """The same, called with a positional input and keyword options (``m(x, scale=s, extra={...})``)."""

    def forward(self, x, *, scale, extra=None):
        return super().forward(x) * scale + (extra or {}).get("bias", 0.0)


def assert_fallback_output(out: torch.Tensor, expected: torch.Tensor, guard) -> None:
    """``out`` is finite and matches the fp32 ``expected`` to the precision of the pins made.

    The fallback ladder steps fp16 -> bf16 where the probe measured bf16 fast (AVX512-BF16,
    AMX, recent GPUs) and fp16 -> fp32 elsewhere; bf16 keeps about 3 significant digits,
    so there the tolerance follows the output's scale.
    """
    assert torch.isfinite(out).all()
    wide = {pin.dtype for pin in guard.pins.values()}
    atol = 1e-2 * float(expected.abs().max()) if "bf16" in wide else 1e-2
    assert torch.allclose(out, expected, rtol=1e-2, atol=atol), (wide, (out - expected).abs().max())


class Gate(nn.Module):
    """Passes its input through; the thread named by ``hold`` waits here until ``release`` is set.

    ``held`` is set when that thread arrives, ``passed`` when any other thread goes through:
    a test can start a second call exactly while the first is in the middle of its forward.
    """

    def __init__(self):
        super().__init__()
        import threading

        self.hold: int | None = None
        self.held, self.passed, self.release = threading.Event(), threading.Event(), threading.Event()

    def forward(self, x):
        import threading

        if threading.get_ident() == self.hold:
            self.held.set()
            if not self.release.wait(10):
                raise TimeoutError("Gate was never released")
        else:
            self.passed.set()
        return x


class GatedOverflowingMLP(nn.Module):
    """:class:`OverflowingMLP` behind a :class:`Gate`: inputs near 1 overflow fp16, inputs near 1e-3 do not."""

    def __init__(self):
        super().__init__()
        self.gate = Gate()
        self.mlp = OverflowingMLP()

    def forward(self, x):
        return self.mlp(self.gate(x))
