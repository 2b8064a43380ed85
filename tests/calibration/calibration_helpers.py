"""Machines and clocks a calibration test controls: nothing here times the machine."""

from __future__ import annotations

import itertools
from typing import Any, Callable

import torch
from torch import nn

from mixprec.device.clock import Clock
from mixprec.device.hardware import DtypeSpeed, Hardware, classify


def machine(bf16: float = 3.0, fp16: float = 1.1, flags: tuple[str, ...] = ("avx512_bf16",),
            klass: dict[str, str] | None = None) -> Hardware:
    """A CPU whose probe measured these ratios to fp32 (``klass`` overrides a class: ``{"bf16": "undecided"}``)."""
    klass = klass or {}
    speeds = {"fp32": 1.0, "tf32": 1.0, "bf16": bf16, "fp16": fp16}
    dtypes = {name: DtypeSpeed(name, name != "tf32", 100 * r, r,
                               klass.get(name, "fast" if name == "fp32" else classify(r, name != "tf32")))
              for name, r in speeds.items()}
    return Hardware("cpu", "test cpu", None, 2**34, flags, 2, torch.__version__, dtypes)


class MLP(nn.Module):
    """Counts its calls; its output depends on every weight. Casts its input to its weights'
    dtype, as app code often does (``x.to(self.dtype)``), unless ``casts_input`` is false."""

    def __init__(self, width: int = 32, depth: int = 3, casts_input: bool = True):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        with torch.no_grad():
            for layer in self.layers:
                layer.weight.copy_(torch.randn(width, width, generator=g) / width**0.5)
        self.calls = 0
        self.casts_input = casts_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.casts_input:
            x = x.to(self.layers[0].weight.dtype)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class DtypeClock(Clock):
    """Seconds decided by what the call ran in: the dtype of ``module``'s first weight at call time,
    and the float32 matmul precision in force (``seconds(dtype, matmul, n)``; ``n`` counts the calls)."""

    name = "scripted"

    def __init__(self, module: nn.Module, seconds: Callable[[torch.dtype, str, int], float]):
        self.module, self.seconds, self.count = module, seconds, itertools.count()

    def time(self, call: Callable[[], Any]) -> tuple[Any, float]:
        result = call()
        dtype = next(self.module.parameters()).dtype
        return result, self.seconds(dtype, torch.get_float32_matmul_precision(), next(self.count))


def by_dtype(**table: float) -> Callable[[torch.dtype, str, int], float]:
    """``by_dtype(fp32=1.0, bf16=0.5)``: seconds per weight dtype (fp32 at matmul ``medium``/``high`` via ``fp32_medium`` ...)."""
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}

    def seconds(dtype: torch.dtype, matmul: str, n: int) -> float:
        name = names[dtype]
        return table.get(f"{name}_{matmul}", table[name])

    return seconds


class Ticks:
    """A wall clock that advances ``step`` seconds every time it is read."""

    def __init__(self, step: float):
        self.step, self.t = step, 0.0

    def __call__(self) -> float:
        self.t += self.step
        return self.t
