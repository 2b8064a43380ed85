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

What was seen and not used is said, with the reason (:attr:`Resolved.unused`): a
``.env`` or config file name in the search folder that is a directory (a virtual
environment made with ``python -m venv .env``) is skipped; a setting under another
app's prefix (``ACE_STEP_FLOAT32_MATMUL_PRECISION`` without ``app="ACE_STEP"``), a name
in lower or mixed case (``mixprec_float32_matmul_precision``: names are matched exactly,
in upper case, as POSIX environments keep them; on Windows the environment itself
ignores case, so such a variable arrives upper-cased and is read), a spelling the app's
own one shadows, and a value a higher source overrode.

A relative path in a file (``MIXPREC_POLICY`` in a ``.env``, ``policy`` in TOML) is read
from that file's folder; from the environment, flags and code, from the working directory.
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

from mixprec._quote import clip, quote
from mixprec._words import describe, dropped, look_alikes, normalise, skeleton
from mixprec.config.names import closest, differences, suggestion
from mixprec.config.options import OPTIONS, Option, default_value, option_for_key
from mixprec.device.settings import NumericSettings
from mixprec.policy import Policy
from mixprec.policy.inputs import file_problem, parse_checked, read_input_text
from mixprec.policy.presets import preset as make_preset

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["ConfigError", "Source", "Setting", "Resolved", "Unused", "resolve", "env_names", "normalise_app"]

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
class Unused:
    """Something a source held that was seen and not used.

    Attributes:
        where: the file and line (``/app/.env line 3``), ``env``, or the skipped file.
        name: the key or variable name (the file's name for a skipped file).
        reason: why it was not used, and what would use it.
        kind: ``near miss`` (a name almost a setting's, another app's prefix: most likely a
            mistake), ``skipped`` (a settings file name that is a folder), ``read as`` (a
            value read after invisible characters were removed), ``shadowed`` (a spelling
            the app's own one beat) or ``overridden`` (a value a higher source beat): the
            first three are warnings, the last two the layering working as documented.
    """

    where: str
    name: str
    reason: str
    kind: str = "near miss"

    @property
    def warns(self) -> bool:
        """Whether this is most likely a mistake the user should hear about (a warning)."""
        return self.kind in ("near miss", "skipped", "read as")

    def __str__(self) -> str:
        return f"{quote(self.name)} ({self.where}): {self.reason}"

    def to_dict(self) -> dict[str, str]:
        return {"where": self.where, "name": self.name, "reason": self.reason, "kind": self.kind}


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
    #: What the sources held that was not used, and why (see :class:`Unused`).
    unused: tuple[Unused, ...] = ()
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
        raise ValueError(f"invalid app prefix {quote(app)}: use letters, digits, '_' or '-', starting with a letter (e.g. 'ACE_STEP')")
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
    unused: list[Unused] = field(default_factory=list)

    def offer(self, option: Option, raw: Any, source: Source, *, file: Path | None = None) -> None:
        """Parse ``raw`` for ``option``; ``file``: the settings file it was read from, whose
        folder a relative path is read from."""
        if option.ascii_only and isinstance(raw, str) and not raw.isascii():
            if not normalise(raw).isascii():
                alike = look_alikes(raw)
                why = f" ({', '.join(f'{describe(c)} looks like {latin!r}' for c, latin in alike[:3])})" if alike else ""
                self.problems.append(f"{option.label} from {source.where}: {quote(raw)} holds non-ASCII characters "
                                     f"({_non_ascii(raw)}), which can look like ASCII ones{why}; valid values: {option.valid}")
                return
            # invisible characters, a no-break space, fullwidth letters: read as the word they show
            self.unused.append(Unused(source.where, option.key, f"value {quote(raw)} read as {quote(normalise(raw))}: {dropped(raw)}",
                                      kind="read as"))
        value_in, looked = raw, ""
        if option.is_path and isinstance(raw, str) and raw.strip() and not Path(raw.strip()).is_absolute():
            if file is not None:  # a path in a settings file is read from that file's folder
                value_in = str(file.parent / raw.strip())
                looked = f" (relative to the folder of {_name(file)}: looked for {_name(value_in)})"
            else:
                looked = f" (relative to the working directory {_name(Path.cwd())})"
        try:
            value = option.parse(value_in)
        except ValueError as exc:
            self.problems.append(f"{option.label} from {source.where}{looked}: {exc}")
            return
        previous = self.values.get(option.key)
        if previous is not None and previous.source.layer != "default":
            self.unused.append(Unused(previous.source.where, option.key, f"overridden by {source.where}"))
        self.values[option.key] = Setting(option, value, source, raw)


def _non_ascii(text: str, shown: int = 3) -> str:
    """``\\u0456 at position 1``: the first non-ASCII characters of ``text``, escaped."""
    found = [f"{ascii(c)[1:-1]} at position {i}" for i, c in enumerate(text) if not c.isascii()]
    return ", ".join(found[:shown]) + (f" and {len(found) - shown} more" if len(found) > shown else "")


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
                col.problems.append(f"{where}: unknown key {quote(key)}{suggestion(key, known)}; valid keys: {', '.join(known)}")
                continue
            col.offer(option, raw, Source("file", f"{where} key {key}"), file=path)
    return used


def _config_paths(config_file: str | os.PathLike[str] | None, search_dir: Path, col: _Collector) -> list[Path]:
    if config_file is not None:
        path = Path(config_file)
        if (problem := file_problem(path)) is not None:
            raise ConfigError([f"config file {_name(path)} {problem}"])
        return [path]
    # Looked up, not named: only files that exist are read, and a directory is skipped with a note.
    return [p for p in (search_dir / "pyproject.toml", search_dir / "mixprec.toml") if _found(p, col)]


def _found(path: Path, col: _Collector) -> bool:
    """Whether ``path``, looked up (not named by the user), is a settings file to read.
    A directory of that name (``python -m venv .env`` makes one) is not a settings file:
    skipped with a note. Any other kind (a FIFO, a device) is read, and so refused."""
    if not path.exists():
        return False
    problem = file_problem(path)
    if problem is None or not path.is_dir():
        return True
    venv = " (a virtual environment?)" if path.is_dir() and (path / "pyvenv.cfg").exists() else ""
    col.unused.append(Unused(_name(path), path.name, f"{problem}{venv}: skipped, not read as a settings file", kind="skipped"))
    return False


def _dotenv_layer(path: Path, app: str | None, col: _Collector) -> bool:
    text = read_text(path, ".env file")
    entries: dict[str, tuple[str | None, int]] = {}
    for binding in parse_stream(io.StringIO(text)):
        if binding.error:
            first = binding.original.string.strip().splitlines()[0] if binding.original.string.strip() else ""
            col.problems.append(f"{path} line {binding.original.line}: malformed .env line {quote(first)}")
        elif binding.key is not None:
            entries[binding.key] = (binding.value, binding.original.line)
    _env_like(entries, app, col, layer="dotenv", where=lambda name, line: f"{path} line {line} {name}", file=path)
    return True


def _env_like(entries: Mapping[str, tuple[str | None, int]], app: str | None, col: _Collector, *, layer: str, where: Any,
              file: Path | None = None) -> None:
    used: dict[str, str] = {}  # option key -> the name read
    for option in OPTIONS:
        for name in env_names(option, app):
            if name in entries:
                raw, line = entries[name]
                col.offer(option, "" if raw is None else raw, Source(layer, where(name, line)), file=file)
                used[option.key] = name
                break
    listed = _not_used(entries, app, used, col, where=(lambda line: str(file) + f" line {line}") if file is not None
                       else (lambda _: layer))
    # A misspelt MIXPREC_ variable is almost always a mistake worth pointing out. Only
    # mixprec's own prefix is checked: an app's prefix also carries the app's settings.
    known = [n for o in OPTIONS for n in env_names(o, None)]
    unknown = [name for name in entries if name.startswith(f"{ENV_PREFIX}_") and name not in known
               and name not in _RESERVED_ENV and name not in listed]
    for name in unknown[:MAX_LISTED]:
        hint = suggestion(name, known) if len(name) <= MAX_QUOTED else ""
        col.warnings.append(f"unknown setting {_name(name)} from {layer}{hint}; ignored")
    if len(unknown) > MAX_LISTED:
        col.warnings.append(f"... and {len(unknown) - MAX_LISTED} more unknown {ENV_PREFIX}_* settings from {layer}; "
                            f"ignored (valid: {', '.join(known)})")


def _not_used(entries: Mapping[str, tuple[str | None, int]], app: str | None, used: dict[str, str], col: _Collector,
              *, where: Any) -> set[str]:
    """Names that look like a setting and were not read, each with the reason: a spelling the
    app's own one shadowed; a near miss of a name that is read (case, a separator, look-alike
    or invisible characters: :func:`mixprec.config.names.closest`); another app's prefix; a
    setting's name without a prefix. Returns the names listed."""
    readable = {name: option for option in OPTIONS for name in env_names(option, app)}
    prefixes = ", ".join(f"{p}_*" for p in ([app] if app and app != ENV_PREFIX else []) + [ENV_PREFIX])
    listed: set[str] = set()
    found = 0
    for name in entries:
        if name in used.values() or name in _RESERVED_ENV or len(name) > MAX_QUOTED:
            continue
        item = _why_not_read(name, readable, used, app, prefixes)
        if item is None:
            continue
        reason, kind = item
        found += 1
        listed.add(name)
        if found <= MAX_LISTED:
            col.unused.append(Unused(where(entries[name][1]), name, reason, kind=kind))
    if found > MAX_LISTED:
        col.unused.append(Unused(where(0).rsplit(" line ", 1)[0], f"{found - MAX_LISTED} more names",
                                 "names like a setting's that were not read (see above)"))
    return listed


def _why_not_read(name: str, readable: dict[str, Option], used: dict[str, str], app: str | None,
                  prefixes: str) -> tuple[str, str] | None:
    """``(reason, kind)`` for an environment name that was not read and looks like a setting's; ``None`` otherwise."""
    if name in readable:
        return f"{used[readable[name].key]} is read instead (the app's own spelling wins)", "shadowed"
    upper = name.upper()
    near = closest(name, list(readable))
    if near is not None and near[1]:
        meant = near[0]
        differ = differences(name, meant)
        if differ == ["lower or mixed case"]:
            return f"names are matched in upper case: write {meant}", "near miss"
        return f"not read: it has {'; '.join(differ) or 'another spelling'}; write {meant}", "near miss"
    shape = skeleton(name)
    option = next((o for o in OPTIONS if shape.endswith("_" + o.env) or shape == o.env), None)
    prefix = shape[: -len(option.env) - 1] if option is not None and shape != option.env else ""
    if option is not None and not prefix and len(option.env) >= _BARE_NAME_MIN:
        return (f"a setting's name without a prefix is not read (read: {prefixes}); write {env_names(option, app)[0]}",
                "near miss")
    if near is not None:  # a typo (MIXPRC_CONV_TF32) before another app's prefix (MYAPP_CONV_TF32)
        return f"not a setting; did you mean {near[0]}?", "near miss"
    if option is not None and prefix.split("_", 1)[0] in _LIBRARY_PREFIXES:
        return None  # another library's own variable (OMP_WAIT_POLICY), not an app's spelling of a setting
    if option is not None and re.fullmatch(r"[A-Z][A-Z0-9_]*", prefix) and prefix not in (app, ENV_PREFIX):
        return (f"prefix {prefix}_ is not this app's (read: {prefixes}); pass --app {prefix} "
                f"(mixprec.init(app={prefix!r}))" + ("" if name == shape else f" and write the name as {shape}")), "near miss"
    if upper.startswith(f"{ENV_PREFIX}_") and upper != name:
        return f"names are matched in upper case, and {clip(upper, escape=True)} is not a setting either", "near miss"
    return None


#: A setting's bare name (without ``MIXPREC_``) this long is taken for one: ``CONV_TF32`` and the
#: longer ones; ``PRESET`` and ``POLICY`` alone are too common to be mixprec's.
_BARE_NAME_MIN = 9


#: The first word of the variables of the runtimes and libraries a PyTorch app runs with: a name of
#: theirs that ends like a setting's (``OMP_WAIT_POLICY``, ``..._POLICY``) is theirs, not another
#: app's prefix before a mixprec setting.
_LIBRARY_PREFIXES = frozenset({
    "OMP", "KMP", "GOMP", "MKL", "OPENBLAS", "ONEDNN", "DNNL", "ATEN", "CUDA", "CUBLAS", "CUDNN", "NCCL", "NVIDIA",
    "TORCH", "PYTORCH", "TORCHINDUCTOR", "TORCHDYNAMO", "TRITON", "HF", "HUGGINGFACE", "TRANSFORMERS", "DIFFUSERS",
    "GRADIO", "RAY", "PYTHON", "PIP", "XDG", "LC", "CONDA", "VIRTUAL", "PYTEST", "MPL",
})

#: Environment variables mixprec reads elsewhere (not settings).
_RESERVED_ENV = frozenset({"MIXPREC_CACHE_DIR", "MIXPREC_LOG_LEVEL", "MIXPREC_DB", "MIXPREC_UPDATE_SCREENSHOTS", "MIXPREC_PROBE_FILE"})


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

    files = _file_layer(_config_paths(config_file, base, col), col)

    dotenv_path = Path(env_file) if env_file is not None else base / ".env"
    if env_file is not None and (problem := file_problem(dotenv_path)) is not None:
        col.problems.append(f".env file {_name(dotenv_path)} {problem}")
    elif env_file is not None or _found(dotenv_path, col):
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
                col.problems.append(f"unknown setting {quote(key)} ({layer}){suggestion(key, known)}; valid: {', '.join(known)}")
                continue
            col.offer(option, raw, Source(layer, where(option)))

    if col.problems:
        raise ConfigError(col.problems)
    return Resolved(settings=dict(col.values), app=app, files=tuple(files), warnings=tuple(col.warnings),
                    unused=tuple(col.unused))
