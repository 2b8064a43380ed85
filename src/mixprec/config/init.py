"""``mixprec.init``: the one call an application makes at start-up."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Callable, Mapping

from mixprec.device import backends
from mixprec.config import Resolved, resolve
from mixprec.config.names import say_once

__all__ = ["init"]

logger = logging.getLogger("mixprec")


def init(
    app: str | None = None,
    *,
    matmul: str | None = None,
    conv_tf32: bool | str | None = None,
    fp16_reduced_precision_reduction: bool | str | None = None,
    bf16_reduced_precision_reduction: bool | str | None = None,
    config_file: str | os.PathLike[str] | None = None,
    env_file: str | os.PathLike[str] | None = None,
    search_dir: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    cli: Mapping[str, Any] | None = None,
    apply: bool = True,
    notes: Callable[[str], object] | None = None,
) -> Resolved:
    """Resolve the numeric settings from every source and apply them to torch.

    Call it once at start-up, before loading models. All sources are resolved
    and validated first; only then are the settings written, all together. One
    INFO line per setting on the ``mixprec`` logger names the value and its
    source, e.g. ``float32 matmul precision = high (from env
    ACE_STEP_FLOAT32_MATMUL_PRECISION)``. What a source held that looks like a
    setting and was not read (``mixprec_float32_matmul_precision``: a near miss
    of a name, see :class:`mixprec.config.sources.Unused`) is a WARNING line,
    written once per process.

    Args:
        app: the application's env-var prefix; ``init(app="ACE_STEP")`` honours
            ``ACE_STEP_FLOAT32_MATMUL_PRECISION`` as well as ``MIXPREC_...``.
        matmul: the float32 matmul precision; this and the next three are explicit
            values, which beat every other source.
        conv_tf32: cuDNN conv TF32.
        fp16_reduced_precision_reduction: fp16 reduced-precision reduction.
        bf16_reduced_precision_reduction: bf16 reduced-precision reduction.
        config_file: a TOML file to read instead of looking up ``pyproject.toml`` and
            ``mixprec.toml``; this and the next four are as in :func:`mixprec.config.resolve`.
        env_file: the ``.env`` file.
        search_dir: where to look for config files.
        environ: the environment; default ``os.environ``.
        cli: values from command-line flags, keyed by config key.
        apply: ``False`` resolves and validates without touching torch.
        notes: where what was seen and not used is said (each note once per process);
            default: a WARNING on the ``mixprec`` logger. The CLI passes its own printer.

    Returns:
        The resolved settings with their sources; ``previous`` holds the state
        before, for :func:`mixprec.restore`.

    Raises:
        mixprec.ConfigError: when any value from any source is invalid; nothing is applied.

    Examples:
        >>> import mixprec
        >>> resolved = mixprec.init(app="MYAPP")
        >>> resolved.numeric.matmul
        'highest'
    """
    code = {
        "float32_matmul_precision": matmul,
        "conv_tf32": conv_tf32,
        "fp16_reduced_precision_reduction": fp16_reduced_precision_reduction,
        "bf16_reduced_precision_reduction": bf16_reduced_precision_reduction,
    }
    resolved = resolve(
        app, code=code, cli=cli, config_file=config_file, env_file=env_file, search_dir=search_dir, environ=environ
    )
    # Seen and not used (a near miss of a setting's name, another app's prefix, a skipped .env
    # folder, a value read without its invisible characters): a warning, once per process however
    # often init runs; a value a higher source overrode is the layering working: an INFO line.
    say = notes if notes is not None else logger.warning
    say_once(resolved.warnings, say)
    say_once((f"not used: {item}" for item in resolved.unused if item.warns), say)
    for item in resolved.unused:
        if not item.warns:
            logger.info("not used: %s", item)
    numeric = resolved.numeric
    policy = resolved.policy()  # None unless a preset or policy file is configured
    if policy is not None and policy.numerics is not None:
        # The policy's global numerics fill in every setting no source set explicitly.
        defaults = {s.option.field: getattr(policy.numerics, s.option.field)
                    for s in resolved.settings.values() if s.option.field and s.source.layer == "default"}
        numeric = numeric.replace(**defaults)
    if not apply:
        return dataclasses.replace(resolved, policy_obj=policy, numeric_override=numeric)
    previous = backends.apply_settings(numeric)
    for line in resolved.log_lines():
        logger.info(line)
    if policy is not None and numeric != resolved.numeric:
        logger.info("float32 numerics from %s policy: %s", policy.name, numeric)
    return dataclasses.replace(resolved, previous=previous, policy_obj=policy, numeric_override=numeric)
