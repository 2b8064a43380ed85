"""Configuration: the options, their sources (defaults, TOML, ``.env``, environment,
CLI, code), and :func:`~mixprec.config.init.init`, which applies the resolved numerics.

Configuration names a preset or a policy file, so it sits above :mod:`mixprec.policy`;
it writes torch flags only through :mod:`mixprec.device.backends`.
"""

from mixprec.config.sources import ConfigError, Resolved, resolve

__all__ = ["ConfigError", "Resolved", "resolve"]
