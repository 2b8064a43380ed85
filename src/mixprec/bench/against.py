"""What an fp8 configuration costs against the 16-bit ones measured beside it.

fp8 weights are about memory: their table row shows the speed against fp32, like every
row, and this note adds what the user weighs them against, the same pipeline with 16-bit
weights in the same rounds: the paired speed ratio and the weight bytes.
"""

from __future__ import annotations

from typing import Any, Sequence

from mixprec._quote import few
from mixprec.bench.evidence import Interval, speedup_cell
from mixprec.bench.rounds import paired

__all__ = ["stores_fp8", "fp8_against_16bit"]


def stores_fp8(policy: Any) -> bool:
    """Whether a stored policy (its dict) stores any weight in fp8."""
    rules = (policy or {}).get("rules") if isinstance(policy, dict) else None
    return any(str(rule.get("storage", "")).startswith("fp8") for rule in rules or () if isinstance(rule, dict))


def _sixteen(policy: Any, name: str) -> bool:
    rules = (policy or {}).get("rules") if isinstance(policy, dict) else None
    storages = {str(rule.get("storage")) for rule in rules or () if isinstance(rule, dict) and rule.get("storage")}
    return name.startswith("naive-") or (bool(storages) and storages <= {"bf16", "fp16", "fp32"} and storages != {"fp32"})


def fp8_against_16bit(batch: int, slots: Sequence[Any]) -> list[str]:
    """One note per fp8 configuration: its speed against each 16-bit one timed in the same
    rounds, and its weight bytes against theirs."""
    def policy(slot: Any) -> Any:
        return (slot.ready or {}).get("policy")

    fp8 = [s for s in slots if s.samples and stores_fp8(policy(s))]
    sixteen = [s for s in slots if s.samples and not stores_fp8(policy(s)) and _sixteen(policy(s), s.spec.name)]
    notes = []
    for slot in fp8:
        parts = []
        for other in sixteen:
            ratio = paired((other.rounds, other.samples), (slot.rounds, slot.samples))
            if ratio is None:
                continue
            cell = speedup_cell(Interval(ratio.value, ratio.low, ratio.high, ratio.n, ratio.exact))
            mine, theirs = (slot.ready or {}).get("weight_bytes"), (other.ready or {}).get("weight_bytes")
            size = f", weights {mine / theirs:.2f}x" if mine and theirs else ""
            parts.append(f"{cell} the speed of {other.spec.name}{size}")
        if parts:
            notes.append(f"batch {batch}: {slot.spec.name} (fp8 weights): {few(parts, sep='; ')}")
    return notes
