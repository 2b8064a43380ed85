"""fp32 compute from 16-bit storage reaches a module's own methods, not only its forward.

The codebook below is written the way EnCodec's ``EuclideanCodebook`` is: its codes are a
buffer, and its parent calls its methods (``encode``, ``decode``) rather than its forward;
those methods read ``self.embed`` themselves (``x @ self.embed.t()``, ``F.embedding``).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mixprec
from mixprec.policy import Policy, Rule


class Codebook(nn.Module):
    def __init__(self, dim: int = 8, size: int = 32):
        super().__init__()
        self.register_buffer("embed", torch.randn(size, dim))

    def quantize(self, x):
        embed = self.embed.t()
        dist = -(x.pow(2).sum(1, keepdim=True) - 2 * x @ embed + embed.pow(2).sum(0, keepdim=True))
        return dist.max(dim=-1).indices

    def dequantize(self, codes):
        return F.embedding(codes, self.embed)

    def encode(self, x):
        return self.quantize(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1])

    def decode(self, codes):
        return self.dequantize(codes)

    def replace_(self, rows, values):
        self.embed.data[rows] = values.to(self.embed.dtype)

    def forward(self, x):
        codes = self.encode(x)
        return self.decode(codes), codes


class ResidualCodec(nn.Module):
    """A projection, then residual quantization through the codebooks' own methods."""

    def __init__(self, stages: int = 3):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.books = nn.ModuleList(Codebook() for _ in range(stages))

    def encode(self, x):
        residual, codes = self.proj(x), []
        for book in self.books:
            c = book.encode(residual)
            residual = residual - book.decode(c)
            codes.append(c)
        return torch.stack(codes)

    def decode(self, codes):
        return sum(book.decode(c) for book, c in zip(self.books, codes))

    def forward(self, x):
        return self.decode(self.encode(x))


def _rounded_fp32(model: ResidualCodec, dtype: torch.dtype) -> ResidualCodec:
    """The same model in fp32 with every tensor rounded to ``dtype``: what fp32 compute
    from ``dtype`` storage computes, bit for bit."""
    twin = ResidualCodec(len(model.books))
    twin.load_state_dict({k: v.to(dtype).float() for k, v in model.state_dict().items()})
    return twin.eval()


class TestOwnMethodsComputeInFp32:
    STORAGES = {"fp16": torch.float16, "bf16": torch.bfloat16}

    @pytest.mark.parametrize("seed", range(3))
    @pytest.mark.parametrize("storage", sorted(STORAGES))
    def test_codes_and_decoding_equal_fp32_compute_on_the_rounded_weights(self, storage, seed):
        torch.manual_seed(seed)
        model = ResidualCodec().eval()
        x = torch.randn(2, 40, 8)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            ref = model(x)
            twin = _rounded_fp32(model, self.STORAGES[storage])
            expected_codes = twin.encode(x)
            expected = twin.decode(expected_codes)
            policy = Policy((Rule("*", storage=storage, compute="fp32"),))
            with mixprec.apply(model, policy), warnings.catch_warnings():
                warnings.simplefilter("error")  # nothing fails and is widened afterwards: no warning
                assert model.books[0].embed.dtype == self.STORAGES[storage]
                codes = model.encode(x)
                decoded = model.decode(codes)
                assert codes.dtype == torch.int64 and torch.equal(codes, expected_codes)
                assert decoded.dtype == torch.float32 and torch.equal(decoded, expected)
                # Through forward too (its own forward calls encode and decode: one set of copies).
                out, book_codes = model.books[0](model.proj(x))
                assert out.dtype == torch.float32 and torch.equal(book_codes, expected_codes[0])
        after = model.state_dict()
        assert all(torch.equal(after[k], v) and after[k].dtype == v.dtype for k, v in before.items())
        with torch.no_grad():
            assert torch.equal(model(x), ref)

    @pytest.mark.parametrize("storage", sorted(STORAGES))
    def test_an_in_place_method_writes_the_stored_tensor(self, storage):
        torch.manual_seed(0)
        model = ResidualCodec().eval()
        policy = Policy((Rule("*", storage=storage, compute="fp32"),))
        with torch.no_grad(), mixprec.apply(model, policy):
            book = model.books[1]
            book.replace_(torch.tensor([0, 3]), torch.full((2, 8), 0.5))
            assert book.embed.dtype == self.STORAGES[storage]
            assert torch.equal(book.embed[[0, 3]].float(), torch.full((2, 8), 0.5))
