"""Which layer kinds are faster kept in fp32, measured on the device, casts included.

A 16-bit dtype that multiplies matrices fast can still be slow for other layers: a
CPU with AVX512-BF16 runs bf16 ``LayerNorm`` at about 0.8x its fp32 speed and a
transposed convolution barely faster; recurrent layers and convolutions differ by
kernel library. A preset that stores such a layer in 16 bits may then be slower than
fp32. The honest comparison is not "layer in bf16 vs layer in fp32" but what a preset
can choose between: the layer in 16 bits on a 16-bit input, or the layer kept in fp32
as an island, its input cast up and its output cast back (what the casts cost is in
the measurement).

:func:`island_gains` times both for each kind in :data:`KINDS` on shapes typical of the
models mixprec serves, in interleaved rounds (each round's fastest call kept). A kind
counts as faster in fp32 only where every round says so by more than
:data:`MARGIN`: noise never adds an island. Rounds are added while a kind's ratios
scatter (:func:`mixprec.device.trust.tight`); a kind whose rounds still scatter is
flagged ``unstable`` and gets no island (a probe holding one is never cached). The 16-bit copy is made with ``.to(dtype)``,
which re-flattens an RNN's weights into cuDNN's single buffer: the state ``apply`` leaves
a cast RNN in (:func:`mixprec.casting.apply.flatten_rnns`), never the re-packing per call
that weights cast one by one would cost.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch
from torch import nn

from mixprec.device.clock import Clock, clock_for
from mixprec.device.trust import interval, tight

__all__ = ["KINDS", "MARGIN", "island_gains"]

#: A layer kind and what it typically meets: a module and an input, built in fp32.
KINDS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "Conv1d": lambda: (nn.Conv1d(128, 128, 7, padding=3), torch.randn(1, 128, 256)),
    "ConvTranspose1d": lambda: (nn.ConvTranspose1d(128, 64, 16, stride=8, padding=4), torch.randn(1, 128, 64)),
    "Conv2d": lambda: (nn.Conv2d(32, 32, 3, padding=1), torch.randn(1, 32, 48, 48)),
    "LSTM": lambda: (nn.LSTM(128, 128, batch_first=True), torch.randn(1, 32, 128)),
    "GRU": lambda: (nn.GRU(128, 128, batch_first=True), torch.randn(1, 32, 128)),
    "LayerNorm": lambda: (nn.LayerNorm(512), torch.randn(1, 128, 512)),
    "GroupNorm": lambda: (nn.GroupNorm(32, 128), torch.randn(1, 128, 24, 24)),
}

#: The island must be faster than the 16-bit layer by this fraction in every round.
MARGIN = 0.10


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _best(call: Callable[[], Any], clock: Clock, budget_s: float) -> float:
    best, spent, calls = float("inf"), 0.0, 0
    while spent < budget_s and calls < 10:
        _, elapsed = clock.time(call)
        spent += elapsed
        calls += 1
        best = min(best, elapsed)
    return best


def island_gains(dtype: torch.dtype, device: torch.device, *, rounds: int = 5, budget_s: float = 0.5,
                 clock: Clock | None = None, max_rounds: int | None = None) -> dict[str, dict[str, Any]]:
    """Per layer kind: ``gain`` (median over rounds of the 16-bit layer's time over the
    fp32 island's: above 1, the island is faster), ``island`` (whether every round
    found it faster by more than :data:`MARGIN`, on rounds that agree), ``unstable``
    (the rounds scattered beyond :data:`~mixprec.device.trust.TIGHT` even after up to
    ``max_rounds``, default twice ``rounds``) and ``range`` (the rounds' range).
    ``budget_s`` bounds the planned rounds; kinds the device cannot run in ``dtype`` are left out.
    ``clock`` times each call (default :func:`~mixprec.device.clock.clock_for` the device: CPU
    time on a CPU, which other processes cannot inflate).
    """
    clock = clock if clock is not None else clock_for(device)
    cases = {}
    gen_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        for kind, build in KINDS.items():
            module, x = build()
            module = module.to(device).eval()
            low = copy.deepcopy(module).to(dtype)
            x16 = x.to(device=device, dtype=dtype)

            def native(m=low, x16=x16):
                return _first(m(x16))

            def island(m=module, x16=x16):
                return _first(m(x16.float())).to(dtype)

            try:
                with torch.no_grad():
                    native()
                    island()
            except (RuntimeError, TypeError, NotImplementedError):
                continue  # no kernel for this kind in this dtype here
            cases[kind] = (native, island)
    finally:
        torch.random.set_rng_state(gen_state)
    per_call = budget_s / max(1, rounds * 2 * len(cases))
    ratios: dict[str, list[float]] = {kind: [] for kind in cases}
    limit = max_rounds if max_rounds is not None else 2 * rounds
    with torch.no_grad():
        for index in range(limit):
            # Re-measured only where the rounds so far scatter; every kind keeps its interleaving.
            todo = cases if index < rounds else {k: c for k, c in cases.items() if not tight(ratios[k])}
            if not todo:
                break
            for kind, (native, island) in todo.items():
                t16 = _best(native, clock, per_call)
                t32 = _best(island, clock, per_call)
                ratios[kind].append(t16 / t32)
    result = {}
    for kind, values in ratios.items():
        ordered = sorted(values)
        steady = tight(values)
        low, high = interval(values) or (0.0, 0.0)
        result[kind] = {"gain": round(ordered[len(ordered) // 2], 3),
                        "island": steady and all(v > 1 + MARGIN for v in values),
                        "unstable": not steady, "range": [round(low, 3), round(high, 3)]}
    return result

