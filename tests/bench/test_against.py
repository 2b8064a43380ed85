"""The note that sets an fp8 configuration against the 16-bit ones timed in the same rounds."""

from __future__ import annotations

from mixprec.bench.against import fp8_against_16bit, stores_fp8
from mixprec.bench.configs import ConfigSpec
from mixprec.bench.slots import Slot

FP8 = {"rules": [{"match": "*", "storage": "fp8"}]}
MEMORY = {"rules": [{"match": "*", "storage": "bf16"}, {"match": "type:*Norm", "keep_fp32": True}]}


def _slot(name: str, kind: str, policy, seconds: list[float], weight_bytes: int) -> Slot:
    return Slot(ConfigSpec(name, kind), 0, samples=list(seconds), rounds=list(range(len(seconds))),
                ready={"policy": policy, "weight_bytes": weight_bytes})


def test_fp8_is_set_against_each_16_bit_configuration_of_the_same_rounds():
    slots = [_slot("fp32", "baseline", None, [1.0] * 6, 400),
             _slot("naive-bf16", "naive", None, [0.5] * 6, 200),
             _slot("memory", "preset", MEMORY, [0.5, 0.5, 0.5, 0.5, 0.5, 0.5], 210),
             _slot("fp8", "fp8", FP8, [1.0] * 6, 105),
             _slot("matmul-high", "matmul", {"numerics": {"matmul": "high"}}, [0.9] * 6, 400)]
    notes = fp8_against_16bit(1, slots)
    assert notes == ["batch 1: fp8 (fp8 weights): 0.50x (0.50–0.50) the speed of naive-bf16, weights 0.53x; "
                     "0.50x (0.50–0.50) the speed of memory, weights 0.50x"]


def test_without_a_16_bit_configuration_or_without_fp8_there_is_no_note():
    assert fp8_against_16bit(1, [_slot("fp32", "baseline", None, [1.0] * 6, 400), _slot("fp8", "fp8", FP8, [1.0] * 6, 105)]) == []
    assert fp8_against_16bit(1, [_slot("naive-bf16", "naive", None, [0.5] * 6, 200)]) == []
    assert stores_fp8(FP8) and not stores_fp8(MEMORY) and not stores_fp8(None)
