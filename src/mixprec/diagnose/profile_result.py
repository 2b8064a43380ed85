"""The result of :func:`~mixprec.diagnose.profile.profile`: per-module range, headroom and
error (:class:`ModuleStats`), ranked by risk, as JSON rows, and as keep-fp32 suggestions.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from mixprec.policy import Policy

__all__ = ["Profile", "ModuleStats", "FP16_MAX"]

FP16_MAX = float(torch.finfo(torch.float16).max)


@dataclass
class ModuleStats:
    """One module's profile (worst case over its calls)."""

    module: str
    type: str
    storage: str
    compute: str
    calls: int = 0
    input_absmax: float = 0.0
    output_absmax: float = 0.0
    underflow_fp16: float = 0.0
    underflow_bf16: float = 0.0
    own_sqnr_db: float | None = None
    inherited_sqnr_db: float | None = None
    #: The 16-bit copy produced inf/NaN on the fp32 input (an internal overflow).
    own_nonfinite: bool = False
    #: Calls in the run under the policy (``calls`` counts the fp32 run).
    policy_calls: int = 0
    #: Why this module's calls could not be paired between the runs (call counts or
    #: output shapes differ); ``inherited_sqnr_db`` is then ``None``.
    pairing_mismatch: str | None = None
    #: Its integer/bool tensor inputs (token ids, masks) differed between the runs at
    #: a paired call: its inherited error starts from different inputs.
    int_inputs_differ: bool = False
    #: It owns floating-point parameters itself (a layer); ``False`` for a block or
    #: component whose own error comes from the layers inside it.
    owns_weights: bool = False
    #: Why a block's own error was not measured (its inputs could not be copied).
    own_skipped: str | None = None
    #: Its input already held inf/NaN in the fp32 run (made by an earlier module or the
    #: model's own code): its numbers say nothing about 16 bits, and it is never suggested.
    input_nonfinite: bool = False

    @property
    def fp16_headroom(self) -> float:
        """Largest absolute value seen over fp16's max: 1.0 or more overflows fp16."""
        return max(self.input_absmax, self.output_absmax) / FP16_MAX

    @property
    def overflows_fp16(self) -> bool:
        """Its output exceeds fp16's range, or its fp16 copy overflowed inside (never for a non-finite input)."""
        if self.input_nonfinite:
            return False
        internal = self.own_nonfinite and self.compute == "fp16"
        return internal or self.output_absmax >= FP16_MAX or not math.isfinite(self.output_absmax)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["fp16_headroom"] = self.fp16_headroom
        data["overflows_fp16"] = self.overflows_fp16
        return data


@dataclass
class Profile:
    """The result of :func:`profile`."""

    policy: Policy
    modules: list[ModuleStats] = field(default_factory=list)
    #: SQNR of the target's output under the policy against the fp32 output (first
    #: floating tensor of each), or ``None`` when there is none or their shapes differ.
    output_sqnr_db: float | None = None

    def by_risk(self) -> list[ModuleStats]:
        """Modules that overflow fp16 first, then by lowest own error SQNR (a layer before the
        block holding it on a tie, so an overflow is named where it happens), then by headroom."""
        def key(s: ModuleStats):
            own = s.own_sqnr_db if s.own_sqnr_db is not None else math.inf
            return (not s.overflows_fp16, own, not s.owns_weights, -s.fp16_headroom)

        return sorted(self.modules, key=key)

    def rows(self) -> list[dict[str, Any]]:
        """Plain rows (JSON-safe: infinities become strings) for tables and the benchmark store."""
        return [{k: _json_safe(v) for k, v in s.to_dict().items()} for s in self.by_risk()]

    def to_json(self) -> str:
        return json.dumps({"policy": self.policy.to_dict(), "output_sqnr_db": _json_safe(self.output_sqnr_db),
                           "modules": self.rows()}, indent=2)

    def suggestions(self, *, min_own_sqnr_db: float = 20.0) -> list[dict[str, Any]]:
        """Keep-fp32 rules that would fix the risky modules: fp16 overflow, or own SQNR below the bound.

        Layers are suggested by their own error. A block is suggested only when its
        own error is below the bound while no layer inside it is (the error comes from
        their combination), so a block never repeats what one of its layers explains.
        """
        out = []
        for s in self.by_risk():
            if (s.compute == "fp32" and s.storage == "fp32") or s.input_nonfinite:
                continue  # nothing in 16 bits, or inf/NaN came in: widening it would not help
            if not s.owns_weights:
                reason = self._block_reason(s, min_own_sqnr_db)
                if reason is not None:
                    out.append({"match": s.module, "keep_fp32": True, "reason": reason})
                continue
            if s.own_nonfinite:
                reason = f"its {s.compute} copy produces inf/NaN on the fp32 input (overflow inside the module)"
            elif s.overflows_fp16 and "fp16" in (s.compute, s.storage):
                reason = f"absmax {s.output_absmax:.4g} exceeds fp16's {FP16_MAX:.0f}"
            elif s.own_sqnr_db is not None and s.own_sqnr_db < min_own_sqnr_db:
                where = s.compute if s.storage == s.compute else f"{s.storage} storage, {s.compute} compute"
                reason = f"own error {s.own_sqnr_db:.1f} dB SQNR in {where} (< {min_own_sqnr_db:g} dB)"
            else:
                continue
            out.append({"match": s.module, "keep_fp32": True, "reason": reason})
        return out

    def _block_reason(self, block: ModuleStats, min_own_sqnr_db: float) -> str | None:
        own = block.own_sqnr_db
        if own is None or not own < min_own_sqnr_db:
            return None
        root = block.module == "(root)"
        inside = [s for s in self.modules if s is not block and s.own_sqnr_db is not None
                  and (root or s.module.startswith(block.module + "."))]
        if any(s.own_sqnr_db < min_own_sqnr_db or s.own_nonfinite for s in inside):
            return None  # a layer (or a smaller block) inside explains it and is suggested itself
        best = min((s.own_sqnr_db for s in inside), default=math.inf)
        return (f"own error {own:.1f} dB SQNR as a block (< {min_own_sqnr_db:g} dB) while every module inside "
                f"stays at {best:.1f} dB or better: the error comes from how they combine")

    def suggestions_toml(self, **kwargs: Any) -> str:
        import tomli_w

        rules = self.suggestions(**kwargs)
        return tomli_w.dumps({"rules": rules}) if rules else ""


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
