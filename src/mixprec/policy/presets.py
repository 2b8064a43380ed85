"""Hardware-aware presets, resolved by a pure function.

``resolve(preset, hardware, hints)`` reads no globals and no environment and does no
I/O: the same inputs give the same :class:`~mixprec.policy.Policy` and reasons. The
capability decisions live in the small table below, not in if-ladders on GPU names.

| preset     | matmul   | storage                                  | fp32 islands / upcasts |
|------------|----------|------------------------------------------|------------------------|
| quality    | highest  | fp32                                     | none needed            |
| balanced   | high     | fastest 16-bit type measured fast        | output heads, sensitive hints; norms of the model's own code and upcast attention only for fp16 |
| fast       | medium   | fastest 16-bit type measured fast        | none; upcast attention if fp16 |
| memory     | high     | 16-bit everywhere (bf16 if supported)    | none; under fp16 own-code norms compute in fp32, and upcast attention |

Checked on a model (:func:`mixprec.calibrate`), ``memory`` takes its fp8 level (fp8 weights,
the same compute) where the model's output meets its floor.

Every island and upcast must pay for itself on the device, because each costs casts at
its edges and, on a GPU, Python work per call:

* **Attention** stays on the 16-bit SDPA path for bf16, which has fp32's exponent range;
  scores are upcast only for fp16 (range 65,504), or where a guard found an overflow.
* **Norms**: torch's norm layers (:data:`~mixprec.policy.roles.TORCH_NORMS`) accumulate
  16-bit inputs in fp32 inside their kernels, so an fp32 island buys nothing there. A
  norm of the model's own code (``role:custom-norm``) may square fp16 inputs, which
  overflow above 256: under fp16 those stay fp32. A pipeline's hint naming a norm type
  (``type:LayerNorm``) follows the same rule.
* **Output heads** (``role:head``, one projection per component output) keep their output
  in fp32 precision in ``balanced`` for two casts per call.

Where the probe measured a layer kind faster kept in fp32 than in the chosen 16-bit type,
casts included (bf16 ``GRU`` on a CPU with AVX512-BF16: several times slower than fp32),
every 16-bit preset keeps that kind fp32 (its weights too: that is what was measured),
each rule giving the measured figure as its reason (shown by ``explain``).

A dtype the probe classed as emulated is never chosen for native compute (fp16 on a
CPU without AVX512-FP16 runs about 140x slower than fp32). On CUDA GPUs without bf16
(compute capability < 8.0) fp16 is used with upcast attention.
"""

from __future__ import annotations

import fnmatch
import warnings
from typing import Any, Mapping

from mixprec._quote import quote
from mixprec.device.hardware import UNDECIDED, UNSTABLE, Hardware
from mixprec.policy import CompileSettings, Policy, PolicyError, Rule
from mixprec.policy.roles import TORCH_NORMS
from mixprec.device.settings import NumericSettings, did_you_mean

__all__ = ["PRESETS", "check_name", "resolve", "preset", "native16", "UnknownPresetError"]

PRESETS: tuple[str, ...] = ("quality", "balanced", "fast", "memory")

#: Norm layers of the model's own code: computed in fp32 under fp16, whose range their
#: squares can leave (torch's own norm layers accumulate in fp32 in their kernels).
_OWN_NORMS = "role:custom-norm"
_TORCH_NORM_NAMES = ", ".join(sorted({cls.__name__.rstrip("123d") for cls in TORCH_NORMS}))
#: Output heads by role: final projections (Linear / conv), not sub-networks named "head".
_HEADS = ("role:head",)


class UnknownPresetError(ValueError):
    """A preset name that does not exist."""


def _fast16(hw: Hardware) -> str | None:
    fast = hw.fast_16bit()
    if hw.device_type == "cuda" and hw.capability is not None and hw.capability < (8, 0):
        # No bf16 tensor cores before Ampere: fp16 is the 16-bit type there.
        fp16 = hw.effective("fp16")
        return "fp16" if fp16.supported and fp16.fast else None
    return fast[0] if fast else None


def _storage16(hw: Hardware) -> str:
    """The 16-bit storage type for the memory preset: bf16 when the device has it."""
    if hw.dtypes["bf16"].supported and not (hw.device_type == "cuda" and hw.capability is not None and hw.capability < (8, 0)):
        return "bf16"
    return "fp16"


def native16(hw: Hardware) -> list[str]:
    """The 16-bit types the device computes natively (supported, not emulated: :meth:`Hardware.effective`),
    bf16 first: what a preset may be resolved with (``resolve(..., dtype=)``)."""
    return [d for d in ("bf16", "fp16") if hw.dtypes[d].supported and hw.effective(d).klass in ("fast", "no_speedup")]


def _hint_rules(hints: tuple[str, ...], dtype: str, **fields: Any) -> tuple[list[Rule], list[str]]:
    """The pipeline's sensitive modules, pinned; a hint naming a norm type follows the norm
    rule (torch's own norms never, the model's own only under fp16), and says so."""
    rules, skipped = [], []
    for hint in hints:
        kind = hint[5:] if hint.startswith("type:") else None
        if kind is not None and fnmatch.fnmatchcase(kind, "*Norm*"):
            torch_norm = any(fnmatch.fnmatchcase(cls.__name__, kind) for cls in TORCH_NORMS)
            if torch_norm or dtype != "fp16":
                skipped.append(hint)
                continue
        rules.append(Rule(hint, optional=True, reason="marked precision-sensitive by the pipeline", **fields))
    reasons = [f"pipeline hints {', '.join(skipped)} not pinned: "
               + ("torch's norm kernels accumulate 16-bit inputs in fp32" if dtype == "fp16" else
                  f"torch's norm kernels accumulate 16-bit inputs in fp32, and {dtype} keeps fp32's exponent range")
               + " (an island would only spare the rounding of the norm's weights and output, for two casts per call)"] \
        if skipped else []
    return rules, reasons


def _norm_rules(dtype: str, **fields: Any) -> tuple[list[Rule], list[str]]:
    """Norm layers: which stay in fp32 under ``dtype``, and why the others do not."""
    why = (f"no fp32 island for torch's norm layers ({_TORCH_NORM_NAMES}): their kernels accumulate "
           f"{dtype} inputs in fp32, so mean and variance keep fp32 precision; an island would only spare the "
           "rounding of the norm's weights and output, for two casts per call")
    if dtype != "fp16":
        return [], [why + f"; norms of the model's own code stay {dtype} too ({dtype} keeps fp32's exponent range)"]
    reason = "a norm of the model's own code may square fp16 inputs, which overflow above 256"
    return [Rule(_OWN_NORMS, optional=True, reason=reason, **fields)], [why, f"norm layers of the model's own code in fp32: {reason}"]


def _island_rules(hardware: Hardware, dtype: str) -> tuple[list[Rule], list[str]]:
    """Layer kinds the probe measured faster kept in fp32 than in ``dtype`` (casts
    included): kept fp32, weights too (what was measured; fp32 compute from 16-bit
    weights would re-cast them on every call), with the figure."""
    rules, reasons = [], []
    for kind, info in sorted(hardware.layers.get(dtype, {}).items()):
        if info.get("unstable"):  # no evidence either way: no island, and said
            low, high = info.get("range") or (info["gain"], info["gain"])
            reasons.append(f"{kind} layers: no fp32 island, their timing rounds in {dtype} ranged from {low:.2f}x to "
                           f"{high:.2f}x (unstable, not used as evidence)")
            continue
        if not info.get("island"):
            continue
        why = f"{kind} measured {info['gain']:.2f}x faster in fp32 than in {dtype} on {hardware.name} (casts included)"
        rules.append(Rule(f"type:{kind}", optional=True, reason=why, keep_fp32=True))
        reasons.append(f"{kind} layers kept in fp32: {why}")
    return rules, reasons


def check_name(name: Any) -> str:
    """The preset ``name`` names, case and surrounding spaces ignored.

    Raises:
        UnknownPresetError: naming the value, the closest preset and the valid names.
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in PRESETS:
        raise UnknownPresetError(f"unknown preset {quote(name)}{did_you_mean(str(key), PRESETS)}; choose one of: {', '.join(PRESETS)}")
    return key


def resolve(name: str, hardware: Hardware, hints: tuple[str, ...] | list[str] = (), *,
            dtype: str | None = None) -> tuple[Policy, list[str]]:
    """Resolve a preset for a device.

    Where the probe's timing could not decide a precision (``undecided``, ``unstable``),
    what the hardware states is used instead (:meth:`Hardware.effective`: AMX-BF16 or
    AVX512-BF16 flags, a CUDA compute capability), and the reasons say so: the same
    preset resolves the same way on a quiet machine and on a busy one.

    Args:
        name: ``quality``, ``balanced``, ``fast`` or ``memory`` (case-insensitive).
        hardware: the measured device (:func:`mixprec.device.hardware.probe`).
        hints: the pipeline's precision-sensitive module names or ``type:`` patterns.
        dtype: resolve with this 16-bit type (``bf16`` or ``fp16``) instead of the one the
            probe ranks first: what a calibration times as the preset's other candidate.

    Returns:
        (policy, human-readable reasons for every choice).

    Raises:
        UnknownPresetError: for any other name.
    """
    key = check_name(name)
    hints = tuple(hints)
    if dtype is not None and dtype not in ("bf16", "fp16"):
        raise PolicyError(f"dtype {quote(dtype)}: a preset is resolved with bf16 or fp16")
    reasons: list[str] = []
    rules: list[Rule] = []
    fast16 = _fast16(hardware) if dtype is None else dtype
    if dtype is not None:
        reasons.append(f"resolved with {dtype} as its 16-bit type (asked for; the probe ranks "
                       f"{_fast16(hardware) or 'no 16-bit type'} first)")
    emulated = [d for d in ("bf16", "fp16") if hardware.dtypes[d].emulated]
    if emulated:
        reasons.append(f"{' and '.join(emulated)} measured emulated on {hardware.name} "
                       f"({', '.join(f'{hardware.dtypes[d].ratio}x fp32' for d in emulated)}): never used for compute")

    for d in ("bf16", "fp16"):
        speed, used = hardware.dtypes[d], hardware.effective(d)
        if speed.klass not in (UNDECIDED, UNSTABLE):
            continue
        why = ("the probe's timing rounds disagreed" if speed.klass == UNDECIDED else f"the probe's figure is unstable "
               f"({speed.note})") + f" on {hardware.name} (a busy machine?), so it is no evidence and is not cached"
        if used is speed:
            reasons.append(f"{d}: {why}; nothing states its class either, so treated as not fast; the next process measures again")
        else:
            reasons.append(f"{d}: {why}; used as {used.klass} {used.note.split(':')[0]}")

    if hardware.device_type == "cuda" and key != "quality":
        reasons.append("a pipeline that decodes token by token is launch-bound on a GPU (hundreds of small kernels per "
                       "token): capture it as CUDA graphs with compile mode 'reduce-overhead', its decoder on a static "
                       "key/value cache (`mixprec explain --compile` names the components that decode)")

    if key == "quality":
        rules.append(Rule("*", storage="fp32", optional=True, reason="quality: full fp32"))
        reasons.append("fp32 storage and compute everywhere; float32 matmul precision 'highest'")
        return Policy(tuple(rules), NumericSettings(matmul="highest"), name=key), reasons

    if key in ("balanced", "fast"):
        matmul = "high" if key == "balanced" else "medium"
        reasons.append(f"float32 matmul precision '{matmul}' for the fp32 parts"
                       + (" (TF32 on this GPU)" if hardware.dtypes["tf32"].supported and hardware.device_type == "cuda" else ""))
        if fast16 is None:
            reasons.append("no 16-bit type measured fast here: weights stay fp32")
            rules.append(Rule("*", storage="fp32", optional=True, reason="no fast 16-bit type on this device"))
            return Policy(tuple(rules), NumericSettings(matmul=matmul), name=key), reasons
        speed = hardware.effective(fast16)
        if speed is not hardware.dtypes[fast16]:
            why = f"{fast16} is {speed.klass} {speed.note.split(':')[0]}"
        else:
            why = f"{fast16} measured {speed.ratio}x fp32 matmul speed"
        rules.append(Rule("*", storage=fast16, optional=True, reason=why))
        reasons.append(f"weights in {fast16}: " + (f"measured {speed.ratio}x the fp32 matmul rate"
                                                    if speed is hardware.dtypes[fast16] else why))
        islands, why = _island_rules(hardware, fast16)
        rules.extend(islands)
        reasons.extend(why)
        if fast16 == "fp16":
            rules.append(Rule("*", upcast_attention=True, optional=True, reason="attention scores and softmax in fp32 (fp16 range 65,504)"))
            reasons.append("attention scores (Q·Kᵀ, softmax) computed in fp32; fp16 overflows above 65,504")
        else:
            reasons.append(f"attention stays on the {fast16} SDPA kernels: {fast16} keeps fp32's exponent range, so scores "
                           "need no upcast (a guard that finds an overflow pins the module)")
        if key == "balanced":
            norms, why = _norm_rules(fast16, keep_fp32=True)
            rules.extend(norms)
            reasons.extend(why)
            rules.extend(Rule(h, keep_fp32=True, optional=True,
                              reason="output head: the component's output keeps fp32 precision")
                         for h in _HEADS)
            reasons.append("output heads (final projections: lm_head, conv_post, final_proj, the last projection of each "
                           "component) kept fp32: two casts per call")
            hinted, why = _hint_rules(hints, fast16, keep_fp32=True)
            rules.extend(hinted)
            reasons.extend(why)
            if hinted:
                reasons.append(f"pipeline's sensitive modules kept fp32: {', '.join(r.match for r in hinted)}")
        else:
            reasons.append("no fp32 islands: every island costs casts at its boundaries"
                           + (f"; the pipeline's sensitive modules ({', '.join(hints)}) are not pinned, use 'balanced' to pin them" if hints else ""))
        return Policy(tuple(rules), NumericSettings(matmul=matmul), name=key), reasons

    # memory
    storage = _storage16(hardware) if dtype is None else dtype
    native = storage == fast16 or not hardware.effective(storage).emulated
    compute = "native" if native else "fp32"
    rules.append(Rule("*", storage=storage, compute=compute, optional=True, reason="memory: 16-bit weights everywhere"))
    reasons.append(f"all weights stored in {storage} (half the fp32 bytes)"
                   + ("" if native else f"; {storage} is emulated here, so compute upcasts to fp32 at each forward"))
    if native:
        islands, why = _island_rules(hardware, storage)
        rules.extend(islands)
        reasons.extend(why)
    if native:  # (otherwise everything computes in fp32 already)
        norms, why = _norm_rules(storage, compute="fp32")
        rules.extend(norms)
        reasons.extend(why)
        if hints:
            reasons.append(f"the pipeline's sensitive modules ({', '.join(hints)}) are not pinned: fp32 compute from "
                           "16-bit weights re-casts their weights on every call; use 'balanced' to keep them fp32")
    if storage == "fp16":
        rules.append(Rule("*", upcast_attention=True, optional=True, reason="fp16 attention scores overflow above 65,504"))
        reasons.append("attention scores computed in fp32 (fp16 range 65,504)")
    elif native:
        reasons.append("attention stays on the bf16 SDPA kernels: bf16 keeps fp32's exponent range, so scores need no upcast")
    return Policy(tuple(rules), NumericSettings(matmul="high"), name=key), reasons


_OVERRIDE_KEYS = ("matmul", "storage", "compute", "upcast_attention", "keep_fp32", "rules", "compile")


def preset(
    name: str,
    *,
    hardware: Hardware | None = None,
    hints: tuple[str, ...] | list[str] = (),
    overrides: Mapping[str, Any] | None = None,
) -> Policy:
    """A preset resolved for this device, with optional apex-style overrides.

    Args:
        name: ``quality`` / ``balanced`` / ``fast`` / ``memory``.
        hardware: default :func:`mixprec.device.hardware.probe` (cached).
        hints: the pipeline's sensitive modules.
        overrides: ``matmul`` (global level), ``storage`` / ``compute`` /
            ``upcast_attention`` / ``keep_fp32`` (appended as a rule on ``*``), and
            ``rules`` (extra :class:`Rule` objects or dicts, appended last so they win),
            ``compile`` (a :class:`CompileSettings`, its table, or ``True``).
            Inconsistent combinations warn: an emulated storage dtype, or
            ``keep_fp32`` together with a 16-bit storage.

    Examples:
        >>> policy = mixprec.preset("fast", overrides={"rules": [{"match": "vae", "keep_fp32": True}]})
    """
    if hardware is None:
        from mixprec.device.hardware import probe

        hardware = probe()
    policy, _ = resolve(name, hardware, hints)
    if overrides is not None and not isinstance(overrides, Mapping):
        raise PolicyError(f"overrides: expected a mapping such as {{'matmul': 'high'}}, got {type(overrides).__name__} "
                          f"{quote(overrides)}; valid keys: {', '.join(_OVERRIDE_KEYS)}")
    if not overrides:
        return policy
    unknown = [k for k in overrides if k not in _OVERRIDE_KEYS]
    if unknown:
        raise PolicyError(f"unknown override {quote(unknown[0])}{did_you_mean(str(unknown[0]), _OVERRIDE_KEYS)}; "
                          f"valid: {', '.join(_OVERRIDE_KEYS)}")
    numerics = policy.numerics
    if overrides.get("matmul") is not None:
        try:
            numerics = (numerics or NumericSettings()).replace(matmul=overrides["matmul"])
        except ValueError as exc:
            raise PolicyError(f"overrides matmul: {exc}") from None
    global_fields = {k: overrides[k] for k in ("storage", "compute", "upcast_attention", "keep_fp32") if overrides.get(k) is not None}
    extra: list[Rule] = []
    if global_fields:
        try:
            extra.append(Rule("*", reason="user override", **global_fields))
        except PolicyError as exc:
            raise PolicyError(f"overrides: {exc}") from None
    extra.extend(_override_rules(overrides.get("rules")))
    for rule in extra:
        if rule.storage and rule.storage != "fp32" and hardware.dtypes[rule.storage].emulated and rule.compute != "fp32":
            warnings.warn(f"override {rule.match!r}: storage {rule.storage} is emulated on {hardware.name} "
                          f"({hardware.dtypes[rule.storage].ratio}x fp32); consider compute='fp32' or another dtype", stacklevel=2)
        if rule.keep_fp32 and rule.storage in ("bf16", "fp16"):
            warnings.warn(f"override {rule.match!r}: keep_fp32 wins over storage={rule.storage}", stacklevel=2)
    compiled = overrides.get("compile")
    if compiled is not None and compiled is not False and not isinstance(compiled, CompileSettings):
        compiled = CompileSettings.from_dict(compiled, "overrides compile")
    return Policy(policy.rules + tuple(extra), numerics, name=f"{policy.name}+overrides", compile=compiled or None)


def _override_rules(given: Any) -> list[Rule]:
    """``overrides["rules"]``: a list (or tuple) of :class:`Rule` objects or tables, each checked."""
    if given is None:
        return []
    if not isinstance(given, (list, tuple)):
        raise PolicyError(f"overrides rules: expected a list of Rule objects or tables such as "
                          f"{{'match': 'vae', 'keep_fp32': True}}, got {type(given).__name__} {quote(given)}")
    rules = []
    for i, rule in enumerate(given):
        if isinstance(rule, Rule):
            rules.append(rule)
        elif isinstance(rule, Mapping):
            rules.append(Rule.from_dict(dict(rule), f"overrides rules[{i}]"))
        else:
            raise PolicyError(f"overrides rules[{i}]: expected a Rule or a table such as {{'match': 'vae', 'keep_fp32': True}}, "
                              f"got {type(rule).__name__} {quote(rule)}")
    return rules
