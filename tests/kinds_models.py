"""A model holding every kind of tensor torch has, as parameters and buffers, and a
pipeline factory for it (``kinds_models.py:build``) that benchmark workers load."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from mixprec.pipelines import EmbeddingOutput, Pipeline


class Tagged(torch.Tensor):
    """A tensor subclass with its own ``__torch_function__`` (results stay ``Tagged``)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


class DoublyTagged(Tagged):
    """A subclass of a subclass."""


class GainParameter(nn.Parameter):
    """An ``nn.Parameter`` subclass, as some libraries define for their weights."""


def _sparse_coo(g: torch.Generator) -> torch.Tensor:
    indices = torch.tensor([[0, 1, 2, 5, 7], [1, 2, 3, 0, 6]])
    return torch.sparse_coo_tensor(indices, torch.randn(5, generator=g), (8, 8)).coalesce()


class EveryKind(nn.Module):
    """Floating, sparse (COO, buffer and parameter; CSR, compressed), quantized, complex, integer,
    bool, meta, nested-subclass and Parameter-subclass tensors, all read by ``forward``
    except the meta one (a buffer a checkpoint has not filled)."""

    #: name -> kind, for every parameter and buffer.
    KINDS = {"lin.weight": "floating", "lin.bias": "floating", "sparse_weight": "sparse", "phase": "complex",
             "gain": "subclass", "shift": "subclass", "coo": "sparse", "csr": "compressed", "quantized": "quantized",
             "spectrum": "complex", "positions": "integer", "mask": "integer", "scale": "subclass", "unloaded": "meta"}

    def __init__(self, seed: int = 0, *, meta: bool = True):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        with warnings.catch_warnings():  # torch's notes that sparse and quantized tensors are beta / deprecated
            warnings.simplefilter("ignore")
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.lin = nn.Linear(8, 8)
            self.sparse_weight = nn.Parameter(_sparse_coo(g) * 0.1)
            self.phase = nn.Parameter(torch.randn(8, dtype=torch.complex64, generator=g))
            self.gain = GainParameter(torch.rand(8, generator=g) + 0.5)
            self.shift = nn.Parameter(torch.randn(8, generator=g).as_subclass(Tagged))
            self.register_buffer("coo", _sparse_coo(g))
            self.register_buffer("csr", (torch.randn(8, 8, generator=g) * 0.1).relu().to_sparse_csr())
            self.register_buffer("quantized", torch.quantize_per_tensor(torch.randn(8, generator=g), 0.05, 0, torch.qint8))
            self.register_buffer("spectrum", torch.randn(8, dtype=torch.complex64, generator=g))
            self.register_buffer("positions", torch.arange(8))
            self.register_buffer("mask", torch.arange(8) % 3 != 0)
            self.register_buffer("scale", (torch.rand(8, generator=g) + 0.5).as_subclass(DoublyTagged))
            if meta:  # torch's own Module.to() refuses a module holding one: pipelines, which move, hold none
                self.register_buffer("unloaded", torch.zeros(4, dtype=torch.long, device="meta"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        dense = self.coo.to_dense() + self.csr.to_dense() + self.sparse_weight.to_dense()
        y = y + y @ dense.to(y.dtype) * 0.1
        y = y + self.quantized.dequantize().to(y.dtype) + (self.phase * self.spectrum).real.to(y.dtype) * 0.1
        y = y * self.gain.to(y.dtype) * self.scale.to(y.dtype) + self.shift.to(y.dtype)
        return y + (self.positions * self.mask).to(y.dtype) * 0.01


def parts(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors that hold ``t``'s values, for bit-exact comparisons (independent of mixprec)."""
    if t.is_meta:
        return []
    t = t.detach()
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    if t.layout == torch.sparse_csr:
        return [t.crow_indices(), t.col_indices(), t.values()]
    if t.is_quantized:
        return [t.int_repr(), torch.tensor([t.q_scale()]), torch.tensor([t.q_zero_point()])]
    if t.is_complex():
        return [torch.view_as_real(t)]
    return [t]


def state(model: nn.Module) -> dict[str, tuple]:
    """Every parameter and buffer: (type, layout, dtype, device, requires_grad, grad, value parts)."""
    out = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        grad = None if t.grad is None else (t.grad.dtype, id(t.grad))
        out[name] = (type(t), t.layout, t.dtype, t.device, t.requires_grad, grad, [p.clone() for p in parts(t)])
    return out


def same_state(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """Names whose type, layout, dtype, device, grad or values differ (bit for bit)."""
    differ = []
    for name in before.keys() | after.keys():
        if name not in before or name not in after:
            differ.append(name)
            continue
        a, b = before[name], after[name]
        if a[:6] != b[:6] or len(a[6]) != len(b[6]):
            differ.append(name)
        elif not all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a[6], b[6])):
            differ.append(name)
    return sorted(differ)


def expected_bytes(model: nn.Module) -> int:
    """What the model's tensors occupy: a sparse one its indices and values, a meta one nothing."""
    return sum(p.numel() * p.element_size() for _, t in [*model.named_parameters(), *model.named_buffers()]
               for p in (parts(t)[:1] if t.is_quantized else parts(t)))


class EveryKindPipeline(Pipeline):
    name = "every-kind"
    output_kind = "embedding"

    def __init__(self, seed: int = 0):
        super().__init__({"net": EveryKind(seed, meta=False)})

    def _example_inputs(self, batch, seed):
        return torch.randn(batch, 8, generator=torch.Generator().manual_seed(seed))

    def _run(self, inputs):
        net = self.components["net"]
        return EmbeddingOutput(output=net(inputs.to(net.lin.weight.dtype)).as_subclass(torch.Tensor).float())


def build(size: str = "default", seed: int = 0) -> EveryKindPipeline:
    return EveryKindPipeline(seed)
