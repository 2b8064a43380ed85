"""The probe's measurement: square matmuls in each dtype and float32 matmul level, timed in
interleaved rounds on the device's clock, and which reduced levels give fp32's bits.

:func:`mixprec.device.hardware.probe` turns what :func:`measure` returns into classes.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from mixprec.device import backends
from mixprec.device.clock import clock_for
from mixprec.device.trust import tight

__all__ = ["MatmulCase", "measure", "verdict", "exact_levels", "classify", "FAST_RATIO", "EMULATED_RATIO", "ROUNDS",
           "MAX_ROUNDS"]

#: Speed relative to fp32 at or above which a precision counts as fast.
FAST_RATIO = 1.2
#: Speed relative to fp32 below which a precision counts as emulated.
EMULATED_RATIO = 0.5

def classify(ratio: float | None, supported: bool) -> str:
    """``fast`` / ``no_speedup`` / ``emulated`` / ``unsupported`` from a speed ratio vs fp32."""
    if not supported or ratio is None:
        return "unsupported"
    if ratio >= FAST_RATIO:
        return "fast"
    if ratio < EMULATED_RATIO:
        return "emulated"
    return "no_speedup"


class MatmulCase:
    """One timed configuration: a dtype and the float32 matmul level in force.

    ``rounds`` holds the fastest call of each round: rounds are interleaved across the
    cases, so round ``i`` of two cases ran under the same conditions.
    """

    def __init__(self, n: int, dtype: torch.dtype, level: str, dev: torch.device):
        self.n, self.level, self.dev = n, level, dev
        self.rounds: list[float] = []
        gen = torch.Generator(device="cpu").manual_seed(0)
        self.a = torch.randn(n, n, generator=gen).to(device=dev, dtype=dtype)
        self.b = torch.randn(n, n, generator=gen).to(device=dev, dtype=dtype)
        self.clock = clock_for(dev)

    def _call(self) -> float:
        """Seconds of one matmul on the device's clock (CPU time on a CPU: other processes cannot inflate it)."""
        return self.clock.time(lambda: torch.mm(self.a, self.b))[1]

    def run(self, budget_s: float, first: bool) -> None:
        with backends.numerics(matmul=self.level):
            if first:
                self._call()  # warm-up (kernel selection, allocation)
            best, spent, calls = None, 0.0, 0
            # A call far slower than the budget (an emulated type) is one call per round.
            while spent < budget_s and calls < 20:
                elapsed = self._call()
                spent += elapsed
                calls += 1
                best = elapsed if best is None else min(best, elapsed)
            self.rounds.append(best)

    @property
    def best(self) -> float | None:
        return min(self.rounds) if self.rounds else None

    @property
    def gflops(self) -> float | None:
        return None if self.best is None else 2.0 * self.n**3 / self.best / 1e9


#: Rounds of the probe, and the most it adds while the rounds disagree on a class.
ROUNDS, MAX_ROUNDS = 3, 7


#: A round whose ratio lies within this factor of a class boundary may fall on either side of it.
_MARGIN = 1.25


def verdict(ratios: list[float]) -> str | None:
    """The class of the rounds' median ratio, or None where more than one round in five
    contradicts it beyond the margin around the class boundaries (noise, not evidence)."""
    if not ratios:
        return None
    klass = classify(statistics.median(ratios), True)
    against = sum(1 for ratio in ratios if classify(ratio, True) != klass
                  and not any(b / _MARGIN <= ratio <= b * _MARGIN for b in (FAST_RATIO, EMULATED_RATIO)))
    # One round in five may be an outlier (a burst of load hits one case of one round).
    return klass if against <= len(ratios) // 5 else None


def measure(dev: torch.device, n: int, budget_s: float, rounds: int = ROUNDS) -> tuple[dict[str, Any], dict[str, float]]:
    """Time every case in interleaved rounds; returns per case its best rate and its
    per-round ratios to fp32, and the fp32 rate per matmul level.

    Interleaving and taking each round's best call keep the classification stable on a
    shared, noisy machine (interference only ever slows a call down); a class is
    decided only when every round gives it, and rounds are added (up to
    :data:`MAX_ROUNDS`) while they disagree.
    """
    specs = {"highest": (torch.float32, "highest"), "high": (torch.float32, "high"), "medium": (torch.float32, "medium"),
             "bf16": (torch.bfloat16, "highest"), "fp16": (torch.float16, "highest")}
    cases: dict[str, MatmulCase | None] = {}
    for key, (dtype, level) in specs.items():
        try:
            cases[key] = MatmulCase(n, dtype, level, dev)
        except (RuntimeError, TypeError):
            cases[key] = None  # no kernel for this dtype on this device

    def ratios(key: str) -> list[float]:
        ref, case = cases["highest"], cases[key]
        if ref is None or case is None:
            return []
        return [r / c for r, c in zip(ref.rounds, case.rounds) if r and c]

    round_index = 0
    while True:
        for key, case in cases.items():
            if case is None:
                continue
            try:
                case.run(budget_s / rounds, first=round_index == 0)
            except (RuntimeError, TypeError):
                cases[key] = None
        round_index += 1
        # Rounds are added while a class is in doubt or a figure's rounds scatter (re-measured, not kept).
        unsettled = [k for k in ("high", "bf16", "fp16") if cases.get(k) is not None
                     and (verdict(ratios(k)) is None or not tight(ratios(k)))]
        if round_index >= MAX_ROUNDS or (round_index >= rounds and not unsettled):
            break
    rate = {k: (c.gflops if c is not None else None) for k, c in cases.items()}
    levels = {k: rate[k] or 0.0 for k in ("highest", "high", "medium")}
    result = {name: {"rate": rate[key], "ratios": ratios(key)}
              for name, key in (("fp32", "highest"), ("tf32", "high"), ("bf16", "bf16"), ("fp16", "fp16"))}
    return result, levels


def exact_levels(dev: torch.device, n: int) -> dict[str, bool]:
    """Per reduced float32 matmul level: whether its product has the same bits as ``highest``'s."""
    gen = torch.Generator(device="cpu").manual_seed(1)
    a, b = (torch.randn(n, n, generator=gen).to(dev) for _ in range(2))
    with backends.numerics(matmul="highest"):
        exact = torch.mm(a, b)
    same = {}
    for level in ("high", "medium"):
        with backends.numerics(matmul=level):
            same[level] = bool(torch.equal(torch.mm(a, b), exact))
    return same
