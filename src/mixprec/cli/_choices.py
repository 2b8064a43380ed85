"""The values each closed-set option accepts, as ``--help`` lists them.

Every list is read from the table the option's value is checked against (the pipelines'
sizes, the presets, the benchmark configurations, the bound metrics...), so a value added
there is listed in the help too. Nothing here loads a pipeline plugin or imports Gradio.
"""

from __future__ import annotations

__all__ = ["bool_help", "bool_values", "bound_help", "config_help", "config_values", "device_values",
           "extension_help", "extension_values", "join_or", "language_values", "matmul_values", "objective_values",
           "pipeline_values", "preset_values", "size_help", "size_units", "sizes"]


def join_or(values: list[str] | tuple[str, ...]) -> str:
    """``a, b or c``."""
    values = list(values)
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def pipeline_values() -> list[str]:
    """The pipelines mixprec ships (plugins are listed by ``mixprec pipelines``)."""
    from mixprec.pipelines import builtin_names

    return builtin_names()


def sizes() -> dict[str, dict[str, str]]:
    """Size -> {pipeline: what that size is for}, over the pipelines mixprec ships, in their order."""
    from mixprec.pipelines import size_notes

    out: dict[str, dict[str, str]] = {}
    for name in pipeline_values():
        for size, purpose in size_notes(name).items():
            out.setdefault(size, {})[name] = purpose
    return out


def size_help() -> str:
    """``--size``: every size, what it is for, and the pipelines it is limited to."""
    every = pipeline_values()
    parts = []
    for size, notes in sizes().items():
        purpose = next((p.split(":")[0].strip() for p in notes.values() if p), "")
        only = "" if len(notes) == len(every) else f"{', '.join(notes)} only"
        said = "; ".join(x for x in (purpose, only) if x)
        parts.append(f"{size} ({said})" if said else size)
    return (f"Pipeline size: {join_or(parts)}; a factory may take its own sizes. "
            "`mixprec pipelines` shows what each size is for and what its weights need.")


def device_values() -> list[str]:
    """``--device``: each device type, ``cuda`` also with its index."""
    from mixprec.device.hardware import DEVICE_TYPES

    return [v for t in DEVICE_TYPES for v in ((t, f"{t}:N") if t == "cuda" else (t,))]


def preset_values() -> tuple[str, ...]:
    from mixprec.policy.presets import PRESETS

    return PRESETS


def config_values() -> list[str]:
    """``--configs``: the built-in configurations."""
    from mixprec.bench.configs import BUILTIN

    return list(BUILTIN)


def config_help() -> str:
    """``bench --configs``: every built-in configuration and the forms a name may take."""
    from mixprec.bench.configs import BUILTIN, CALIBRATED_SUFFIX, COMPILE_SUFFIX

    presets = [name for name, (kind, _, _) in BUILTIN.items() if kind == "preset"]
    return (f"Comma-separated configurations: {', '.join(BUILTIN)}, or a policy .toml/.json file; "
            f"NAME{COMPILE_SUFFIX} runs one compiled, PRESET{CALIBRATED_SUFFIX} ({', '.join(presets)}) checks the "
            "preset on the pipeline first (default: all that can help here).")


def objective_values() -> dict[str, str]:
    from mixprec.tuning.tuner import OBJECTIVES

    return OBJECTIVES


def size_units() -> list[str]:
    """The units a size (``gate --memory-noise-floor``) may be given in."""
    from mixprec.bench.gate import SIZE_UNITS

    return list(SIZE_UNITS)


def bound_help() -> str:
    """``tune --bound``: the grammar, every metric and every comparison."""
    from mixprec.tuning.bounds import METRICS, OPS

    return (f"Quality bound 'metric op number', e.g. 'snr>=30' or 'cosine>=0.999'; metric: {', '.join(METRICS)}; "
            f"op: {', '.join(OPS)}.")


def matmul_values() -> tuple[str, ...]:
    from mixprec.device.settings import MATMUL_LEVELS

    return MATMUL_LEVELS


def bool_values() -> tuple[str, ...]:
    """The words a boolean setting accepts, ``true`` and ``false`` first."""
    from mixprec.device.settings import FALSE_WORDS, TRUE_WORDS

    return tuple(w for pair in zip(TRUE_WORDS, FALSE_WORDS) for w in pair)


def bool_help(what: str = "") -> str:
    from mixprec.device.settings import FALSE_WORDS, TRUE_WORDS

    also = ", ".join(f"{t}/{f}" for t, f in zip(TRUE_WORDS[1:], FALSE_WORDS[1:]))
    return f"{TRUE_WORDS[0]} | {FALSE_WORDS[0]} (also {also}){': ' + what if what else ''}"


def language_values() -> list[str]:
    from mixprec._languages import LANGUAGES

    return list(LANGUAGES)


def extension_values() -> dict[str, tuple[str, ...]]:
    """``run --out``: output kind -> the file extensions written for it."""
    from mixprec.pipelines import EXTENSIONS

    return EXTENSIONS


def extension_help() -> str:
    kinds = [f"{join_or(exts)} ({kind})" for kind, exts in extension_values().items()]
    return f"Output file: {', '.join(kinds)}, as the pipeline's output kind allows."
