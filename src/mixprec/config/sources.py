"""Layered configuration: where each setting comes from, and which source wins.

Sources, lowest to highest priority:

1. built-in defaults (torch's own defaults);
2. ``[tool.mixprec]`` in ``pyproject.toml``, then ``mixprec.toml`` (top-level keys),
   both looked up in the working directory, or an explicit ``config_file``;
3. a ``.env`` file (``MIXPREC_*`` or ``<APP>_*`` keys);
4. environment variables (``MIXPREC_*`` or ``<APP>_*``; the app's spelling wins);
5. command-line flags;
6. explicit arguments in code.

Every value is parsed and validated before anything is returned, and every
error names its source (env var, file and key, or flag), the bad value and the
valid values. Nothing here touches torch.
"""

from __future__ import annotations

import io
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from dotenv.parser import parse_stream

from mixprec.config.options import OPTIONS, Option, default_value, option_for_key
from mixprec.device.settings import NumericSettings, did_you_mean
from mixprec.policy import Policy
from mixprec.policy.inputs import file_problem, parse_checked, read_input_text
from mixprec.policy.presets import preset as make_preset

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["ConfigError", "Source", "Setting", "Resolved", "resolve", "env_names", "normalise_app"]

ENV_PREFIX = "MIXPREC"

#: Layer names, lowest priority first.
LAYERS: tuple[str, ...] = ("default", "file", "dotenv", "env", "cli", "code")


class ConfigError(ValueError):
    """One or more configuration values are invalid; nothing was applied.

    Attributes:
        problems: one message per invalid value, each naming its source.
    """

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        head = "invalid mixprec configuration; nothing was applied:" if len(problems) > 1 else "invalid mixprec configuration; nothing was applied: "
        shown = [_clip(p) for p in problems[:MAX_LISTED]]
        if len(problems) > MAX_LISTED:
            shown.append(f"... and {len(problems) - MAX_LISTED} more problems")
        body = "\n  - " + "\n  - ".join(shown) if len(problems) > 1 else shown[0]
        super().__init__(head + body)


@dataclass(frozen=True)
class Source:
    """Where a value came from.

    Attributes:
        layer: one of ``LAYERS``.
        where: what a person would look for: ``env ACE_STEP_FLOAT32_MATMUL_PRECISION``,
            ``/app/mixprec.toml key float32_matmul_precision``, ``flag --conv-tf32``...
    """

    layer: str
    where: str

    def __str__(self) -> str:
        return self.where


@dataclass(frozen=True)
class Setting:
    option: Option
    value: Any
    source: Source
    raw: Any = None


@dataclass(frozen=True)
class Resolved:
    """The result of resolving every source: each setting's value and origin."""

    settings: dict[str, Setting]
    app: str | None = None
    files: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    #: After ``mixprec.init``: the backends snapshot taken before applying, for ``mixprec.restore``.
    previous: Any = None
    #: After ``mixprec.init``: the configured policy (or ``None``) and the numerics applied.
    policy_obj: Any = None
    numeric_override: Any = None

    @property
    def numeric(self) -> NumericSettings:
        """The resolved global numeric settings (after ``init``: those applied)."""
        if self.numeric_override is not None:
            return self.numeric_override
        return NumericSettings(**{s.option.field: s.value for s in self.settings.values() if s.option.field})

    @property
    def preset(self) -> str | None:
        return self.settings["preset"].value

    @property
    def policy_file(self) -> str | None:
        return self.settings["policy"].value

    def policy(self, hardware: Any = None, hints: tuple[str, ...] = ()) -> Any:
        """The configured :class:`~mixprec.policy.Policy`, or ``None`` when neither a
        preset nor a policy file is set. When both are set, the one from the
        higher-priority source wins (a policy file on a tie)."""
        preset, policy = self.settings["preset"], self.settings["policy"]
        if preset.value is None and policy.value is None:
            return None
        use_file = policy.value is not None and (
            preset.value is None or LAYERS.index(policy.source.layer) >= LAYERS.index(preset.source.layer)
        )
        if use_file:
            return Policy.load(policy.value)
        return make_preset(preset.value, hardware=hardware, hints=hints)

    def source_of(self, key: str) -> Source:
        return self.settings[key].source

    def rows(self) -> list[dict[str, Any]]:
        """One row per setting: key, label, value, layer, source."""
        return [
            {"key": k, "label": s.option.label, "value": s.value, "layer": s.source.layer, "source": s.source.where}
            for k, s in self.settings.items()
        ]

    def log_lines(self) -> list[str]:
        return [f"{s.option.label} = {_show(s.value)} (from {s.source.where})" for s in self.settings.values()]


def _show(value: Any) -> str:
    if value is None:
        return "not set"
    return str(value).lower() if isinstance(value, bool) else str(value)


def normalise_app(app: str | None) -> str | None:
    """``"ace-step"`` -> ``"ACE_STEP"``; validates the prefix an app chose."""
    if app is None:
        return None
    if not isinstance(app, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_\-]*", app.strip()):
        raise ValueError(f"invalid app prefix {app!r}: use letters, digits, '_' or '-', starting with a letter (e.g. 'ACE_STEP')")
    return app.strip().upper().replace("-", "_")


def env_names(option: Option, app: str | None) -> list[str]:
    """Environment-variable spellings of ``option``, highest priority first."""
    names = [f"{app}_{option.env}"] if app and app != ENV_PREFIX else []
    return names + [f"{ENV_PREFIX}_{option.env}"]


#: Problems listed in one error; the rest are counted.
MAX_LISTED = 20
#: Characters of a value or line quoted in a message.
MAX_QUOTED = 200


def _name(name: Any) -> str:
    """A name or path quoted in a message, cut when it is absurdly long."""
    text = str(name)
    return text if len(text) <= MAX_QUOTED else f"{text[:60]}... ({len(text)} characters)"


def _clip(text: str) -> str:
    return text if len(text) <= 2 * MAX_QUOTED else f"{text[:MAX_QUOTED]}... ({len(text)} characters)"


@dataclass
class _Collector:
    values: dict[str, Setting] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def offer(self, option: Option, raw: Any, source: Source) -> None:
        try:
            value = option.parse(raw)
        except ValueError as exc:
            self.problems.append(f"{option.label} from {source.where}: {exc}")
            return
        self.values[option.key] = Setting(option, value, source, raw)


def read_text(path: Path, what: str) -> str:
    """A UTF-8 text file, or a :class:`ConfigError` naming the file and what is wrong: not a regular
    file (a directory, a FIFO, ``/dev/zero``), too large, or the first bad byte. A byte-order mark is dropped."""
    try:
        return read_input_text(path, what)
    except ValueError as exc:
        raise ConfigError([str(exc)]) from None


def _read_toml(path: Path) -> dict[str, Any]:
    text = read_text(path, "config file")
    try:
        return parse_checked(tomllib.loads, text, str(path))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: malformed TOML: {exc}"]) from None
    except ValueError as exc:  # nested too deeply
        raise ConfigError([str(exc)]) from None


def _file_layer(paths: list[Path], col: _Collector) -> list[str]:
    used = []
    for path in paths:
        data = _read_toml(path)
        if path.name == "pyproject.toml":
            tool = data.get("tool", {})
            if not isinstance(tool, dict):  # `tool = "x"`: not a table, so no [tool.mixprec] either
                col.problems.append(f"{path} key tool: expected a table ([tool.*] sections), got {type(tool).__name__}")
                continue
            table = tool.get("mixprec")
            where = f"{path} [tool.mixprec]"
            if table is None:
                continue
        else:
            table = data.get("mixprec", data) if set(data) == {"mixprec"} else data
            where = str(path)
        if not isinstance(table, dict):
            col.problems.append(f"{where}: expected a table of settings, got {type(table).__name__}")
            continue
        used.append(str(path))
        known = [o.key for o in OPTIONS]
        for key, raw in table.items():
            option = option_for_key(key)
            if option is None:
                col.problems.append(f"{where}: unknown key {key!r}{did_you_mean(key, known)}; valid keys: {', '.join(known)}")
                continue
            col.offer(option, raw, Source("file", f"{where} key {key}"))
    return used


def _config_paths(config_file: str | os.PathLike[str] | None, search_dir: Path) -> list[Path]:
    if config_file is not None:
        path = Path(config_file)
        if (problem := file_problem(path)) is not None:
            raise ConfigError([f"config file {_name(path)} {problem}"])
        return [path]
    # Looked up, not named: only files that exist are read (and then must be regular files).
    return [p for p in (search_dir / "pyproject.toml", search_dir / "mixprec.toml") if p.exists()]


def _dotenv_layer(path: Path, app: str | None, col: _Collector) -> bool:
    text = read_text(path, ".env file")
    entries: dict[str, tuple[str | None, int]] = {}
    for binding in parse_stream(io.StringIO(text)):
        if binding.error:
            first = binding.original.string.strip().splitlines()[0] if binding.original.string.strip() else ""
            col.problems.append(f"{path} line {binding.original.line}: malformed .env line {first!r}")
        elif binding.key is not None:
            entries[binding.key] = (binding.value, binding.original.line)
    _env_like(entries, app, col, layer="dotenv", where=lambda name, line: f"{path} line {line} {name}")
    return True


def _env_like(entries: Mapping[str, tuple[str | None, int]], app: str | None, col: _Collector, *, layer: str, where: Any) -> None:
    for option in OPTIONS:
        for name in env_names(option, app):
            if name in entries:
                raw, line = entries[name]
                col.offer(option, "" if raw is None else raw, Source(layer, where(name, line)))
                break
    # A misspelt MIXPREC_ variable is almost always a mistake worth pointing out. Only
    # mixprec's own prefix is checked: an app's prefix also carries the app's settings.
    known = [n for o in OPTIONS for n in env_names(o, None)]
    unknown = [name for name in entries
               if name.startswith(f"{ENV_PREFIX}_") and name not in known and name not in _RESERVED_ENV]
    for name in unknown[:MAX_LISTED]:
        hint = did_you_mean(name, known) if len(name) <= MAX_QUOTED else ""
        col.warnings.append(f"unknown setting {_name(name)} from {layer}{hint}; ignored")
    if len(unknown) > MAX_LISTED:
        col.warnings.append(f"... and {len(unknown) - MAX_LISTED} more unknown {ENV_PREFIX}_* settings from {layer}; "
                            f"ignored (valid: {', '.join(known)})")


#: Environment variables mixprec reads elsewhere (not settings).
_RESERVED_ENV = frozenset({"MIXPREC_CACHE_DIR", "MIXPREC_LOG_LEVEL", "MIXPREC_DB", "MIXPREC_UPDATE_SCREENSHOTS"})


def resolve(
    app: str | None = None,
    *,
    code: Mapping[str, Any] | None = None,
    cli: Mapping[str, Any] | None = None,
    config_file: str | os.PathLike[str] | None = None,
    env_file: str | os.PathLike[str] | None = None,
    search_dir: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Resolved:
    """Resolve every setting from every source; validate all before returning.

    Args:
        app: the application's env-var prefix (``"ACE_STEP"`` reads
            ``ACE_STEP_FLOAT32_MATMUL_PRECISION`` as well as ``MIXPREC_...``).
        code: explicit values from code, keyed by config key (``float32_matmul_precision``).
        cli: values from command-line flags, keyed by config key.
        config_file: a TOML file to read instead of looking up ``pyproject.toml``
            and ``mixprec.toml`` in ``search_dir``.
        env_file: the ``.env`` file; default ``.env`` in ``search_dir`` if it exists.
        search_dir: where to look for config files; default the working directory.
        environ: the environment; default ``os.environ``.

    Raises:
        ConfigError: listing every invalid value with its source.
    """
    app = normalise_app(app)
    base = Path(search_dir) if search_dir is not None else Path.cwd()
    col = _Collector()
    for option in OPTIONS:
        col.values[option.key] = Setting(option, default_value(option), Source("default", "default"))

    files = _file_layer(_config_paths(config_file, base), col)

    dotenv_path = Path(env_file) if env_file is not None else base / ".env"
    if env_file is not None and (problem := file_problem(dotenv_path)) is not None:
        col.problems.append(f".env file {_name(dotenv_path)} {problem}")
    elif dotenv_path.exists():
        _dotenv_layer(dotenv_path, app, col)
        files.append(str(dotenv_path))

    env = os.environ if environ is None else environ
    _env_like({k: (v, 0) for k, v in env.items()}, app, col, layer="env", where=lambda name, _line: f"env {name}")

    for layer, given, where in (("cli", cli, lambda o: f"flag {o.flag}"), ("code", code, lambda o: f"argument {o.key}=")):
        for key, raw in (given or {}).items():
            if raw is None:
                continue
            option = option_for_key(key)
            if option is None:
                known = [o.key for o in OPTIONS]
                col.problems.append(f"unknown setting {key!r} ({layer}){did_you_mean(key, known)}; valid: {', '.join(known)}")
                continue
            col.offer(option, raw, Source(layer, where(option)))

    if col.problems:
        raise ConfigError(col.problems)
    return Resolved(settings=dict(col.values), app=app, files=tuple(files), warnings=tuple(col.warnings))
