"""Benchmark configurations: mixprec presets and policy files, and the alternatives users pick.

A configuration is data (:class:`ConfigSpec`); :func:`setup` turns it into a change of
a pipeline inside a worker process and returns a context manager for each run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager

import torch

from mixprec._quote import quote
from mixprec._words import normalise
from mixprec.casting.apply import apply
from mixprec.casting.explain import explain_unmatched
from mixprec.casting.compile import check_compiler
from mixprec.device.backends import apply_settings
from mixprec.device.hardware import Hardware
from mixprec.device.settings import NumericSettings, did_you_mean
from mixprec.diagnose.guard import guard
from mixprec.policy import CompileSettings, Policy, Rule
from mixprec.policy.presets import preset
from mixprec.policy.select import UnmatchedRuleWarning, summarise_unmatched

__all__ = ["ConfigSpec", "BUILTIN", "parse_configs", "default_configs", "setup", "unmatched_notes", "UnknownConfigError"]

#: name -> (kind, argument, description)
BUILTIN: dict[str, tuple[str, Any, str]] = {
    "fp32": ("baseline", None, "plain fp32, torch defaults"),
    "matmul-high": ("matmul", "high", 'torch.set_float32_matmul_precision("high") alone'),
    "matmul-medium": ("matmul", "medium", 'torch.set_float32_matmul_precision("medium") alone'),
    "autocast-bf16": ("autocast", torch.bfloat16, "torch.autocast(dtype=torch.bfloat16) around each run"),
    "autocast-fp16": ("autocast", torch.float16, "torch.autocast(dtype=torch.float16) around each run"),
    "naive-bf16": ("naive", torch.bfloat16, "every component .to(torch.bfloat16)"),
    "naive-fp16": ("naive", torch.float16, "every component .half()"),
    "quality": ("preset", "quality", "mixprec preset"),
    "balanced": ("preset", "balanced", "mixprec preset"),
    "fast": ("preset", "fast", "mixprec preset"),
    "memory": ("preset", "memory", "mixprec preset"),
    "fp8": ("fp8", "fp8", "every layer's weights in fp8 (a scale per output channel), computed in bf16"),
}

_DEFAULT = ("fp32", "matmul-high", "matmul-medium", "autocast-bf16", "naive-bf16", "naive-fp16",
            "quality", "balanced", "fast", "memory")


class UnknownConfigError(ValueError):
    """A configuration name that is neither built in nor a policy file."""


@dataclass(frozen=True)
class ConfigSpec:
    """One configuration to measure.

    Attributes:
        name: as given by the user (``fast``, ``naive-fp16``, ``my_policy.toml``,
            ``memory+compile``).
        kind: ``baseline``, ``matmul``, ``autocast``, ``naive``, ``preset``, ``fp8`` or ``policy``.
        arg: the matmul level, dtype name, preset name or policy file path.
        compile: the configuration's components are compiled (``torch.compile``,
            inductor) after it is set up; the worker times the first call, which
            compiles, separately.
        calibrated: a preset checked on the pipeline first (``fast+calibrated``:
            :func:`mixprec.calibrate` on the run's inputs, a remembered decision reused);
            the stored policy's name says what was kept and how fast it measured.
    """

    name: str
    kind: str
    arg: str | None = None
    compile: bool = False
    calibrated: bool = False

    @property
    def dtype(self) -> str | None:
        """The 16-bit dtype this configuration relies on, if any."""
        if self.kind in ("autocast", "naive"):
            return self.arg
        if self.kind == "fp8":
            return "bf16"  # its compute dtype
        return None


COMPILE_SUFFIX = "+compile"
CALIBRATED_SUFFIX = "+calibrated"


def _spec(name: str) -> ConfigSpec:
    if name.endswith(COMPILE_SUFFIX) and len(name) > len(COMPILE_SUFFIX):
        return dataclasses.replace(_spec(name[: -len(COMPILE_SUFFIX)]), name=name, compile=True)
    if name.endswith(CALIBRATED_SUFFIX) and len(name) > len(CALIBRATED_SUFFIX):
        base = _spec(name[: -len(CALIBRATED_SUFFIX)])
        if base.kind != "preset" or base.compile:
            raise UnknownConfigError(f"configuration {quote(name)}: {CALIBRATED_SUFFIX} checks a preset on the pipeline; "
                                     f"use it on quality, balanced, fast or memory (e.g. fast{CALIBRATED_SUFFIX}, "
                                     f"fast{CALIBRATED_SUFFIX}{COMPILE_SUFFIX})")
        return dataclasses.replace(base, name=name, calibrated=True)
    if name in BUILTIN:
        kind, arg, _ = BUILTIN[name]
        if isinstance(arg, torch.dtype):
            arg = "bf16" if arg == torch.bfloat16 else "fp16"
        return ConfigSpec(name, kind, arg)
    if name.endswith((".toml", ".json")):
        if not Path(name).is_file():
            raise UnknownConfigError(f"policy file {quote(name, limit=300)} does not exist")
        Policy.load(name)  # validate now, before any worker starts
        return ConfigSpec(name, "policy", os.path.abspath(name))
    raise UnknownConfigError(
        f"unknown configuration {quote(name)}{did_you_mean(name, list(BUILTIN))}; valid: {', '.join(BUILTIN)}, or a policy "
        f".toml/.json file; any of them with {COMPILE_SUFFIX} (e.g. fast{COMPILE_SUFFIX}) runs compiled, a preset with "
        f"{CALIBRATED_SUFFIX} is first checked on the pipeline"
    )


def parse_configs(text: str | None, hardware: Hardware, *, compiled_twins: bool = False) -> tuple[list[ConfigSpec], list[str]]:
    """Parse ``--configs`` (comma-separated); ``None`` gives the defaults for this hardware.

    ``compiled_twins`` (``--compile``) adds a ``+compile`` twin after every
    configuration that is not compiled already.

    Returns:
        (configurations, notes for the report). ``fp32`` is always measured (first), as
        the reference for quality and speed-up.
    """
    if text is None:
        specs, notes = default_configs(hardware)
        return (_with_twins(specs) if compiled_twins else specs), notes
    specs, notes = _parse_names(text)
    return (_with_twins(specs) if compiled_twins else specs), notes


def _with_twins(specs: list[ConfigSpec]) -> list[ConfigSpec]:
    names = {s.name for s in specs}
    out = []
    for spec in specs:
        out.append(spec)
        if not spec.compile and spec.name + COMPILE_SUFFIX not in names:
            out.append(dataclasses.replace(spec, name=spec.name + COMPILE_SUFFIX, compile=True))
    return out


def _name(given: str) -> str:
    folded = normalise(given)
    return folded if folded.split("+", 1)[0] in BUILTIN else given.strip()


def _parse_names(text: str) -> tuple[list[ConfigSpec], list[str]]:
    # a built-in name is read as every source's words are (case, a no-break space, invisible
    # characters, fullwidth letters); a policy file's name is a path, taken as written
    names = [_name(n) for n in text.split(",") if normalise(n)]
    if not names:
        raise UnknownConfigError(f"--configs {quote(text)} names no configuration; valid: {', '.join(BUILTIN)}")
    specs = [_spec(n) for n in dict.fromkeys(names)]
    notes = []
    if "fp32" not in names:
        specs.insert(0, _spec("fp32"))
        notes.append("fp32 added: it is the reference for quality and speed-up")
    elif names[0] != "fp32":
        # The reference runs first in every round and every ratio is taken against it.
        specs.sort(key=lambda spec: spec.name != "fp32")
        notes.append("fp32 moved first: it is the reference for quality and speed-up")
    return specs, notes


def default_configs(hardware: Hardware) -> tuple[list[ConfigSpec], list[str]]:
    """The default list, leaving out what the probe says cannot help here."""
    specs, notes = [], []
    for name in _DEFAULT:
        spec = _spec(name)
        if spec.dtype and hardware.dtypes[spec.dtype].emulated:
            notes.append(f"{name} left out: the probe measured {spec.dtype} emulated on {hardware.name} "
                         f"({hardware.dtypes[spec.dtype].ratio}x fp32); ask for it by name to run it")
            continue
        if name == "matmul-high" and not hardware.dtypes["tf32"].supported:
            notes.append(f"matmul-high left out: TF32 changes nothing on {hardware.name} (measured "
                         f"{hardware.dtypes['tf32'].ratio}x fp32); ask for it by name to run it")
            continue
        if spec.kind == "matmul" and hardware.matmul_exact.get(spec.arg):
            # It would compute what fp32 computes: any speed-up it showed would be noise.
            notes.append(f"{name} left out: on {hardware.name} an fp32 matmul at {spec.arg!r} computes the same bits "
                         f"as at 'highest' (the probe compared them); ask for it by name to run it")
            continue
        specs.append(spec)
    return specs, notes


def setup(spec: ConfigSpec, pipe: Any, hardware: Hardware | None = None,
          inputs: Any = None) -> tuple[Callable[[], ContextManager], dict[str, Any]]:
    """Change ``pipe`` as ``spec`` says (inside a worker process); a ``+calibrated`` preset is
    first checked on ``inputs`` (the run's own).

    A ``+compile`` configuration is then compiled: a preset or policy through its
    ``compile`` setting (:class:`mixprec.CompileSettings`, so the guard checks outside
    the compiled code), any other configuration by compiling each component.

    Returns:
        (a factory of the context manager each run executes in, details: ``policy``
        dict or ``None``, and ``guard`` for presets and policies).

    Raises:
        mixprec.ApplyError: a compiled configuration on a machine without a C++ compiler.
    """
    context, info = _configure(spec, pipe, hardware, inputs)
    if spec.compile and spec.kind not in ("preset", "policy"):
        settings = CompileSettings()
        check_compiler(settings, any(p.device.type == "cpu" for c in pipe.components.values() for p in c.parameters()))
        for component in pipe.components.values():
            component.compile(mode=settings.mode, dynamic=settings.dynamic, backend=settings.backend)
    return context, info


def _configure(spec: ConfigSpec, pipe: Any, hardware: Hardware | None,
               inputs: Any = None) -> tuple[Callable[[], ContextManager], dict[str, Any]]:
    info: dict[str, Any] = {"policy": None, "guard": None}
    if spec.kind == "baseline":
        return contextlib.nullcontext, info
    if spec.kind == "matmul":
        apply_settings(NumericSettings(matmul=spec.arg))  # a fresh worker: nothing to restore
        info["policy"] = {"numerics": {"matmul": spec.arg}}
        return contextlib.nullcontext, info
    if spec.kind == "autocast":
        dtype = torch.bfloat16 if spec.arg == "bf16" else torch.float16
        device = pipe.device.type if hasattr(pipe, "device") else "cpu"
        return (lambda: torch.autocast(device_type=device, dtype=dtype)), info
    if spec.kind == "naive":
        dtype = torch.bfloat16 if spec.arg == "bf16" else torch.float16
        for component in pipe.components.values():
            component.to(dtype)
        return contextlib.nullcontext, info
    if spec.kind == "preset" and spec.calibrated:
        from mixprec.calibration import calibrate

        result = calibrate(pipe, spec.arg, inputs, hardware=hardware)
        per = "".join(f"; {line}" for line in result.component_lines())  # shown per component by the report and the UI
        policy = dataclasses.replace(result.policy, name=f"{spec.arg}, calibrated: {result.headline().split(': ', 1)[1]}{per}")
        info["calibration"] = result.to_dict()
    elif spec.kind == "preset":
        policy = preset(spec.arg, hardware=hardware, hints=tuple(getattr(pipe, "sensitive", ())))
    elif spec.kind == "fp8":
        policy = Policy((Rule("*", storage="fp8", optional=True, reason=BUILTIN["fp8"][2]),), name="fp8")
    else:
        policy = Policy.load(spec.arg)
    if spec.compile and policy.compile is None:
        policy = dataclasses.replace(policy, compile=CompileSettings())
    with warnings.catch_warnings():
        # Rules that match no module are reported once, before the run (unmatched_notes), not by every worker.
        warnings.simplefilter("ignore", UnmatchedRuleWarning)
        applied = apply(pipe, policy, keep_original="cpu")
    info["policy"] = policy.to_dict()
    info["guard"] = guard(applied, on_nonfinite="fallback", hardware=hardware, remember=False)
    return contextlib.nullcontext, info


def unmatched_notes(specs: list[ConfigSpec], pipeline: str, *, size: str = "default", seed: int = 0) -> list[str]:
    """For each policy-file configuration, its rules that match no module of ``pipeline``
    (summarised when many), as notes for the run: checked once here, before any worker
    starts, on the pipeline built on the ``meta`` device (no weight memory); a factory that
    refuses ``meta`` is built as the workers build it."""
    files = [spec for spec in specs if spec.kind == "policy"]
    if not files:
        return []
    from mixprec.pipelines import get
    from mixprec.pipelines._sizes import build_on_meta

    try:
        pipe = build_on_meta(pipeline, size=size, seed=seed)
    except Exception:  # a factory that cannot build on meta; the real build reports its own errors
        pipe = get(pipeline, size=size, seed=seed)
    notes = []
    for spec in files:
        unmatched = explain_unmatched(pipe, Policy.load(spec.arg))
        notes += [f"{spec.name}: {line}" for line in summarise_unmatched(unmatched)]
    return notes
