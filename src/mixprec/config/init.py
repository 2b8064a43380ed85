"""``mixprec.init``: the one call an application makes at start-up."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Mapping

from mixprec.device import backends
from mixprec.config import Resolved, resolve

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
) -> Resolved:
    """Resolve the numeric settings from every source and apply them to torch.

    Call it once at start-up, before loading models. All sources are resolved
    and validated first; only then are the settings written, all together. One
    INFO line per setting on the ``mixprec`` logger names the value and its
    source, e.g. ``float32 matmul precision = high (from env
    ACE_STEP_FLOAT32_MATMUL_PRECISION)``.

    Args:
        app: the application's env-var prefix; ``init(app="ACE_STEP")`` honours
            ``ACE_STEP_FLOAT32_MATMUL_PRECISION`` as well as ``MIXPREC_...``.
        matmul, conv_tf32, fp16_reduced_precision_reduction, bf16_reduced_precision_reduction:
            explicit values, which beat every other source.
        config_file, env_file, search_dir, environ, cli: see :func:`mixprec.config.resolve`.
        apply: ``False`` resolves and validates without touching torch.

    Returns:
        The resolved settings with their sources; ``previous`` holds the state
        before, for :func:`mixprec.restore`.

    Raises:
        mixprec.ConfigError: when any value from any source is invalid; nothing is applied.

    Example:
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
    for message in resolved.warnings:
        logger.warning(message)
    for item in resolved.unused:  # seen and not used: another app's prefix, lower case, a skipped .env folder...
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
