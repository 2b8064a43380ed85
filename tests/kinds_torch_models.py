"""A small model holding one tensor of a kind under test, the policies each kind is tried
under, and a bit-exact record of every tensor of a model (any kind torch has): for
``tests/casting/test_kinds_torch.py`` and ``test_kinds_modes.py``."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

import mixprec
from mixprec.device.hardware import DtypeSpeed, Hardware, classify

X = torch.randn(3, 8, generator=torch.Generator().manual_seed(5))


def hw() -> Hardware:
    speeds = {"fp32": 1.0, "tf32": 1.0, "bf16": 2.8, "fp16": 1 / 140}
    dtypes = {name: DtypeSpeed(name, True, 100 * r, r, "fast" if name == "fp32" else classify(r, name != "tf32"))
              for name, r in speeds.items()}
    return Hardware("cpu", "test cpu", None, 2**34, (), 2, torch.__version__, dtypes)


POLICIES = {"fast": lambda: mixprec.preset("fast", hardware=hw()),
            "bf16": lambda: mixprec.Policy(rules=(mixprec.Rule("*", storage="bf16"),)),
            "fp8": lambda: mixprec.Policy(rules=(mixprec.Rule("*", storage="fp8"),))}


def parts(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding ``t``'s values, for bit-exact comparison (independent of mixprec)."""
    t = t.detach()
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        return [p for n in names if isinstance(getattr(t, n), torch.Tensor) for p in parts(getattr(t, n))]
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)
    if t.is_nested:
        return [p for u in t.unbind() for p in parts(u)]
    if t.layout == torch._mkldnn:
        return [t.to_dense()]
    if t.is_quantized:
        return [t.int_repr()]
    if t.layout != torch.strided:  # the compressed sparse layouts
        return [t.to_dense()]
    t = t.resolve_conj().resolve_neg()
    return [torch.view_as_real(t) if t.is_complex() else t]


def state(model: nn.Module) -> dict[str, tuple]:
    """Every tensor: its object, type, layout, dtype, storage, strides, inference-ness, grad_fn and values."""
    out = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        plain = not (t.is_nested or t.layout != torch.strided or is_traceable_wrapper_subclass(t) or t.is_quantized
                     or t._is_zerotensor())
        where = (t.untyped_storage().data_ptr(), t.storage_offset(), t.stride()) if plain else None
        out[name] = (id(t), type(t), t.layout, t.dtype, t.requires_grad, t.is_inference(), type(t.grad_fn), where,
                     [p.clone() for p in parts(t)])
    return out


def changed(before: dict[str, tuple], model: nn.Module) -> list[str]:
    after = state(model)
    return sorted(n for n in before.keys() | after.keys() if n not in before or n not in after
                  or before[n][:8] != after[n][:8] or len(before[n][8]) != len(after[n][8])
                  or not all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(before[n][8], after[n][8])))


class Holder(nn.Module):
    """Two linear layers (the second one's weight is stored in fp8 under an fp8 policy: the first
    weight of a component stays out) and one more tensor of the kind under test, which forward reads."""

    def __init__(self, make: Callable[[Holder], None]):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.inp = nn.Linear(8, 8)
            self.lin = nn.Linear(8, 8)
        make(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(self.inp(x))
        for name, t in [*self.named_parameters(), *self.named_buffers()]:
            if not name.startswith(("lin.", "inp.")):
                values = torch.cat([p.reshape(-1).float() for p in parts(t)])
                y = y + values.sum().to(y.dtype) * 1e-3
        return y


def buffer(name: str, make: Callable[[], torch.Tensor]) -> Callable[[Holder], None]:
    return lambda m: m.register_buffer(name, make())


def param(name: str, make: Callable[[], torch.Tensor]) -> Callable[[Holder], None]:
    return lambda m: setattr(m, name, nn.Parameter(make(), requires_grad=make().is_floating_point()))
