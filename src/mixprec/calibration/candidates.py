"""What a calibration times for a preset: a pure function of the preset, the probe and the hints.

:func:`candidates` lists, for one preset, the policies a user could have ended up with and
that the preset must not lose to on this model:

* ``rules``: the preset as the rules resolve it from the probe;
* ``rules-fp16`` / ``rules-bf16``: the same preset resolved with the other 16-bit type, where
  the device computes both natively (``bf16`` and ``fp16`` where the rules chose fp32);
* ``rules-no-matmul``: the preset's rules without its float32 matmul level (what the
  level adds, measured);
* ``fp32-high`` / ``fp32-medium``: fp32 weights at the preset's matmul level;
* ``naive-bf16`` / ``naive-fp16``: every module in that type and nothing else, no wrapper
  (``Policy.wrappers="none"``): the one-line cast ``model.to(dtype)``, and the preset
  without its extras (islands, upcasts, matmul level, wrappers). Where the model's own
  code cannot meet the dtypes without mixprec's casts, its first call fails and it is out;
* ``fp32``: the model as it is, untouched: the reference every ratio is taken against;
* ``rules-fp8`` (memory only): the memory rules with fp8 weights instead of 16-bit ones.

Policies that come out identical are timed once under the first label, the others named in
``also``. The memory preset only chooses among candidates that store 16-bit or fp8 weights
(its objective is memory), and takes its fp8 level without timing wherever that meets its
floor; ``quality`` is fp32 at ``highest`` by definition: nothing to choose.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from mixprec.device.hardware import Hardware
from mixprec.device.settings import NumericSettings
from mixprec.policy import Policy, Rule
from mixprec.policy.presets import check_name, native16, resolve

__all__ = ["Candidate", "candidates", "REFERENCE"]

#: The label of the untouched model.
REFERENCE = "fp32"


@dataclass(frozen=True)
class Candidate:
    """One policy a calibration times.

    Attributes:
        label: ``rules``, ``rules-fp16``, ``naive-bf16``, ``fp32``, ...
        policy: the policy (``None`` for :data:`REFERENCE`, the untouched model).
        what: one line saying what it is.
        eligible: whether the preset may choose it (``memory`` chooses 16-bit storage only).
        also: labels of other candidates that came out as the same policy.
        simplicity: how little it changes (the untouched model most, the rules least): of
            two candidates the rounds time alike, the simpler is kept.
    """

    label: str
    policy: Policy | None
    what: str
    eligible: bool = True
    also: tuple[str, ...] = ()
    simplicity: int = 0


def _key(policy: Policy | None) -> str:
    """What a policy does (its rules' reasons and its name left out)."""
    if policy is None:
        return "untouched"
    data = dataclasses.replace(policy, name="candidate").to_dict()
    data["rules"] = [{k: v for k, v in rule.items() if k != "reason"} for rule in data["rules"]]
    return json.dumps(data, sort_keys=True)


def _storages(policy: Policy) -> set[str]:
    return {r.storage for r in policy.rules if r.storage}


def _fp8_level(rules: Policy) -> Policy:
    """The memory preset's fp8 level: its 16-bit storage rules store fp8, computed as before
    (in that 16-bit type natively, or fp32 where the rules compute fp32 from 16-bit weights)."""
    out = []
    for rule in rules.rules:
        if rule.storage in ("bf16", "fp16"):
            compute = rule.compute if rule.compute not in (None, "native") else rule.storage
            rule = dataclasses.replace(rule, storage="fp8", compute=compute,
                                       reason=f"memory's fp8 level: fp8 weights computed in {compute}")
        out.append(rule)
    return dataclasses.replace(rules, rules=tuple(out), name="memory")


def candidates(preset: str, hardware: Hardware, hints: tuple[str, ...] | list[str] = ()) -> list[Candidate]:
    """The candidates of ``preset`` on ``hardware``, in the order a calibration tries them: the
    rule-based resolution, the untouched fp32 model, the one-line casts (the rules' type first),
    then the preset's variants (see the module docstring).

    Raises:
        UnknownPresetError: for a name that is not a preset.
    """
    key = check_name(preset)
    hints = tuple(hints)
    rules, _ = resolve(key, hardware, hints)
    natives = native16(hardware)
    chosen = _storages(rules) - {"fp32"}
    memory = key == "memory"
    level = rules.numerics.matmul if rules.numerics is not None else "highest"

    # In the order they are tried (a time limit may stop the first calls before the last):
    # the rules, the untouched model, the one-line casts, then the preset's variants.
    found: list[Candidate] = [Candidate("rules", rules, f"{key} as the rules resolve it from the probe")]
    found.append(Candidate(REFERENCE, None, "the model as it is (fp32, torch's defaults): the reference",
                           eligible=not memory, simplicity=5))
    if key != "quality":
        for dtype in sorted(natives, key=lambda d: d not in chosen):
            found.append(Candidate(f"naive-{dtype}", Policy((Rule("*", storage=dtype, optional=True,
                                                                  reason=f"every module in {dtype}, no wrapper"),),
                                                            name=f"naive-{dtype}", wrappers="none"),
                                   f"every module in {dtype}, no wrapper (the one-line cast; {key} without its extras)",
                                   simplicity=4))
        for dtype in natives:
            if dtype not in chosen:
                policy, _ = resolve(key, hardware, hints, dtype=dtype)
                found.append(Candidate(f"rules-{dtype}", dataclasses.replace(policy, name=key),
                                       f"{key} resolved with {dtype} as its 16-bit type", simplicity=1))
        if level != "highest":
            found.append(Candidate("rules-no-matmul", dataclasses.replace(rules, numerics=None),
                                   f"{key}'s rules without its float32 matmul level '{level}'", simplicity=2))
            found.append(Candidate(f"fp32-{level}", Policy((Rule("*", storage="fp32", optional=True),),
                                                           NumericSettings(matmul=level), name=f"fp32-{level}"),
                                   f"fp32 weights, float32 matmul precision '{level}'", eligible=not memory, simplicity=3))

    if memory:  # tried right after the rules: memory keeps it without timing wherever it meets the floor
        found.insert(1, Candidate("rules-fp8", _fp8_level(rules), "memory with fp8 weights (a scale per output channel) "
                                  "computed as the rules compute: the fewest weight bytes, where the floor holds",
                                  simplicity=0))

    merged: dict[str, Candidate] = {}
    for cand in found:
        k = _key(cand.policy)
        if k in merged:
            first = merged[k]
            merged[k] = dataclasses.replace(first, also=first.also + (cand.label,), eligible=first.eligible or cand.eligible)
        else:
            merged[k] = cand
    out = list(merged.values())
    if memory:  # memory chooses among 16-bit storage only
        out = [dataclasses.replace(c, eligible=c.policy is not None and bool(_storages(c.policy) - {"fp32"})) for c in out]
    return out
