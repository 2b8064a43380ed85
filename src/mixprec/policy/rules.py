"""Precision policies: what each module stores and computes in, as data.

A :class:`Policy` is the optional global :class:`~mixprec.device.settings.NumericSettings`
plus an ordered list of :class:`Rule`. Each rule selects modules and sets some of
``storage``, ``compute``, ``keep_fp32``, ``upcast_attention`` and ``output_dtype``.

Matching and precedence:

* ``match`` is a glob on the qualified module name (``vae``, ``t3.*``, ``*.norm*``),
  ``type:<glob>`` on the class name or any of its base-class names
  (``type:LayerNorm``, ``type:*Norm``), ``role:head`` for output heads (final
  projections), ``role:norm`` for normalisation layers (not the projections an
  adaptive norm owns) or ``role:custom-norm`` for those that are not torch's own
  (whose kernels accumulate in fp32), see :mod:`mixprec.policy.roles`.
* A rule applies to every module it matches **and to their descendants**, so
  ``vae`` covers the whole VAE.
* For each field separately, **the last rule that matches and sets it wins**.
* ``keep_fp32 = true`` pins the module to fp32 storage and compute whatever any
  ``storage`` rule says, in any order: a pin is a pin.

:mod:`mixprec.policy.select` resolves a policy over a model; :mod:`mixprec.casting` casts.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from mixprec._quote import quote
from mixprec.policy.inputs import parse_checked, read_input_text
from mixprec.policy.roles import ROLES
from mixprec.device.settings import NumericSettings, did_you_mean

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["DTYPE_NAMES", "FP8_NAMES", "STORAGE_NAMES", "COMPUTE_MODES", "Rule", "Policy", "PolicyError", "CompileSettings"]

#: The dtypes a module can compute in (and an output can be cast to).
DTYPE_NAMES: tuple[str, ...] = ("fp32", "bf16", "fp16")
#: 8-bit weight storage (:mod:`mixprec.casting.fp8`): e4m3 (``fp8``) or e5m2, a scale per output channel.
FP8_NAMES: tuple[str, ...] = ("fp8", "fp8-e5m2")
#: Storage dtypes a policy may name.
STORAGE_NAMES: tuple[str, ...] = DTYPE_NAMES + FP8_NAMES
#: ``native``: compute in the storage dtype (bf16 for fp8 storage); a dtype: compute in it
#: from the stored weights, converted (dequantised) at each forward.
COMPUTE_MODES: tuple[str, ...] = ("native", "fp32", "bf16", "fp16")

_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
            "float8": "fp8", "float8_e4m3fn": "fp8", "fp8_e4m3fn": "fp8", "fp8-e4m3": "fp8", "fp8_e4m3": "fp8", "e4m3": "fp8",
            "float8_e5m2": "fp8-e5m2", "fp8_e5m2": "fp8-e5m2", "e5m2": "fp8-e5m2"}
RULE_FIELDS = ("storage", "compute", "keep_fp32", "upcast_attention", "output_dtype")


class PolicyError(ValueError):
    """A policy, rule or policy file is invalid."""


def nfc(name: str) -> str:
    """``name`` in Unicode NFC, the form rules and module names are compared in."""
    return name if name.isascii() else unicodedata.normalize("NFC", name)


def _dtype_name(value: Any, what: str, valid: tuple[str, ...] = DTYPE_NAMES) -> str:
    if not isinstance(value, str):
        raise PolicyError(f"{what}: expected a string, one of {', '.join(valid)}; got {type(value).__name__} {quote(value)}")
    name = _ALIASES.get(value.strip().lower(), value.strip().lower())
    if name not in valid:
        why = " (fp8 is a storage type: weights are computed in 16 or 32 bits)" if name in FP8_NAMES else ""
        raise PolicyError(f"{what}: unknown dtype {quote(value)}{why}{did_you_mean(name, valid)}; valid: {', '.join(valid)}")
    return name


def _opt_bool(value: Any, what: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise PolicyError(f"{what}: expected true or false, got {type(value).__name__} {quote(value)}")


@dataclass(frozen=True)
class Rule:
    """Select modules and set some of their precision properties.

    Attributes:
        match: qualified-name glob, or ``type:<class-name glob>``.
        storage: ``fp32`` / ``bf16`` / ``fp16`` for parameters and buffers; ``fp8`` /
            ``fp8-e5m2`` for the weights of torch's ``Linear``, convolution and
            ``Embedding`` layers (a scale per output channel; everything else in the
            compute dtype).
        compute: ``native`` (compute in the storage dtype; bf16 for fp8 storage) or a
            dtype, ``fp32`` / ``bf16`` / ``fp16``, to compute in from the stored weights
            (converted or dequantised at each forward).
        keep_fp32: pin to fp32 storage and compute, surviving ``.half()`` by the app.
        upcast_attention: compute attention scores (Q·Kᵀ, softmax) in fp32.
        output_dtype: cast the module's floating outputs to this dtype.
        optional: do not warn when the rule matches nothing (used by presets).
        reason: why the rule exists, shown by ``mixprec explain``.
    """

    match: str
    storage: str | None = None
    compute: str | None = None
    keep_fp32: bool | None = None
    upcast_attention: bool | None = None
    output_dtype: str | None = None
    optional: bool = False
    reason: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.match, str) or not self.match.strip():
            raise PolicyError(f"rule match: expected a non-empty string, got {quote(self.match)}")
        # Names are compared in Unicode NFC: 'é' typed as one code point matches 'é' stored as two.
        object.__setattr__(self, "match", unicodedata.normalize("NFC", self.match.strip()))
        if self.match.startswith("type:") and not self.match[5:].strip():
            raise PolicyError(f"rule match {quote(self.match)}: give a class name after 'type:'")
        if self.match.startswith("role:") and self.match[5:].strip() not in ROLES:
            raise PolicyError(f"rule match {quote(self.match)}: unknown role{did_you_mean(self.match[5:].strip(), ROLES)}; "
                              f"valid: {', '.join('role:' + r for r in ROLES)}")
        where = f"rule {quote(self.match)}"
        if self.storage is not None:
            object.__setattr__(self, "storage", _dtype_name(self.storage, f"{where} storage", STORAGE_NAMES))
        if self.output_dtype is not None:
            object.__setattr__(self, "output_dtype", _dtype_name(self.output_dtype, f"{where} output_dtype"))
        if self.compute is not None:
            compute = _ALIASES.get(self.compute.strip().lower(), self.compute.strip().lower()) if isinstance(self.compute, str) else None
            if compute not in COMPUTE_MODES:
                why = " (fp8 is a storage type: weights are computed in 16 or 32 bits)" if compute in FP8_NAMES else ""
                raise PolicyError(f"{where} compute: invalid value {quote(self.compute)}{why}; valid: {', '.join(COMPUTE_MODES)}")
            object.__setattr__(self, "compute", compute)
        for name in ("keep_fp32", "upcast_attention"):
            _opt_bool(getattr(self, name), f"{where} {name}")
        _opt_bool(self.optional, f"{where} optional")
        if not any(getattr(self, f) is not None for f in RULE_FIELDS):
            raise PolicyError(f"{where} sets nothing; give at least one of {', '.join(RULE_FIELDS)}")

    @property
    def is_type(self) -> bool:
        return self.match.startswith("type:")

    @property
    def role(self) -> str | None:
        return self.match[5:].strip() if self.match.startswith("role:") else None

    def matches(self, qualname: str, module: nn.Module, roles: dict[str, set[int]] | None = None) -> bool:
        """Whether the rule selects ``module`` itself (not counting ancestors).

        ``roles`` maps a role to the ``id`` of the modules that have it (see
        :func:`resolve_modules`); without it a ``role:`` rule matches nothing.
        """
        if self.role is not None:
            return roles is not None and id(module) in roles.get(self.role, ())
        if self.is_type:
            pattern = self.match[5:].strip()
            return any(fnmatch.fnmatchcase(nfc(cls.__name__), pattern) for cls in type(module).__mro__)
        return fnmatch.fnmatchcase(nfc(qualname), self.match)

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        if not data.get("optional"):
            data.pop("optional", None)
        if not data.get("reason"):
            data.pop("reason", None)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "rule") -> Rule:
        if not isinstance(data, dict):
            raise PolicyError(f"{where}: expected a table, got {type(data).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in known:
                raise PolicyError(f"{where}: unknown key {quote(key)}{did_you_mean(key, known)}; valid keys: {', '.join(known)}")
        if "match" not in data:
            raise PolicyError(f"{where}: missing key 'match' (a name glob or 'type:ClassName')")
        for key in ("reason", "match"):
            if key in data and not isinstance(data[key], str):
                raise PolicyError(f"{where} key {quote(key)}: expected a string, got {type(data[key]).__name__}")
        try:
            return cls(**data)
        except PolicyError as exc:
            raise PolicyError(f"{where}: {exc}") from None


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class CompileSettings:
    """How ``apply`` compiles each component (``torch.compile``).

    Attributes:
        mode: one of :data:`COMPILE_MODES`.
        dynamic: ``True``/``False`` as ``torch.compile(dynamic=...)``; ``None`` lets
            Dynamo decide (static first, dynamic after a shape changes).
        backend: the ``torch.compile`` backend (``inductor``; ``eager`` or
            ``aot_eager`` trace without generating code).
    """

    mode: str = "default"
    dynamic: bool | None = None
    backend: str = "inductor"

    def __post_init__(self) -> None:
        if self.mode not in COMPILE_MODES:
            raise PolicyError(f"compile mode: unknown mode {quote(self.mode)}{did_you_mean(str(self.mode), COMPILE_MODES)}; "
                              f"valid: {', '.join(COMPILE_MODES)}")
        _opt_bool(self.dynamic, "compile dynamic")
        if not isinstance(self.backend, str) or not self.backend:
            raise PolicyError(f"compile backend: expected a backend name such as inductor, got {quote(self.backend)}")

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"mode": self.mode, "backend": self.backend}
        if self.dynamic is not None:
            data["dynamic"] = self.dynamic
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "compile") -> CompileSettings:
        if data is True:
            return cls()
        if not isinstance(data, dict):
            raise PolicyError(f"{where}: expected a table (mode, dynamic, backend) or true, got {type(data).__name__} {quote(data)}")
        known = ["mode", "dynamic", "backend"]
        for key in data:
            if key not in known:
                raise PolicyError(f"{where}: unknown key {quote(key)}{did_you_mean(key, known)}; valid keys: {', '.join(known)}")
        try:
            return cls(**data)
        except PolicyError as exc:
            raise PolicyError(f"{where}: {exc}") from None
        except TypeError as exc:
            raise PolicyError(f"{where}: {exc}") from None


@dataclass(frozen=True)
class Policy:
    """A serialisable precision policy: global numerics plus ordered rules.

    Attributes:
        rules: applied in order; for each field the last matching rule wins.
        numerics: global float32 settings to apply with the policy, or ``None``
            to leave the process-wide flags as they are.
        name: a label (preset name or ``custom``).
        version: schema version.
        model_declarations: honour the precision the models declare themselves
            (transformers' and diffusers' ``_keep_in_fp32_modules``, diffusers'
            ``_skip_layerwise_casting_patterns``, a VAE's ``force_upcast``).
        compile: compile each component after applying (:class:`CompileSettings`),
            or ``None`` to leave them as they are. Revert undoes it.
        wrappers: ``auto`` (casts at every place dtypes may meet: component entries, app
            entries, fp32 islands; what makes a policy run on code written for fp32) or
            ``none`` (the weights are cast as planned and nothing else is installed, as
            ``model.to(dtype)`` does: the model's own code must meet the dtypes). ``none``
            holds only while every module has one storage and compute dtype and nothing is
            upcast; a mixed plan (a keep-fp32 rule, a guard's pin) gets its wrappers.

    Examples:
        >>> Policy(rules=(Rule("*", storage="bf16"), Rule("type:*Norm", keep_fp32=True)))
    """

    rules: tuple[Rule, ...] = ()
    numerics: NumericSettings | None = None
    name: str = "custom"
    version: int = 1
    model_declarations: bool = True
    compile: CompileSettings | None = None
    wrappers: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple(self.rules))
        if self.wrappers not in WRAPPERS:
            raise PolicyError(f"policy wrappers: {quote(self.wrappers)}; choose one of: {', '.join(WRAPPERS)}")
        if self.compile is not None and not isinstance(self.compile, CompileSettings):
            raise PolicyError(f"policy compile must be CompileSettings or None, got {type(self.compile).__name__}")
        if not isinstance(self.model_declarations, bool):
            raise PolicyError(f"policy model_declarations: expected true or false, got {quote(self.model_declarations)}")
        for rule in self.rules:
            if not isinstance(rule, Rule):
                raise PolicyError(f"policy rules must be Rule objects, got {type(rule).__name__}")
        if self.numerics is not None and not isinstance(self.numerics, NumericSettings):
            raise PolicyError(f"policy numerics must be NumericSettings or None, got {type(self.numerics).__name__}")
        if type(self.version) is not int or self.version != 1:
            raise PolicyError(f"unsupported policy version {quote(self.version)}; this mixprec reads version 1")

    # -- (de)serialisation ---------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"version": self.version, "name": self.name}
        if self.numerics is not None:
            data["numerics"] = {k: v for k, v in self.numerics.to_dict().items() if k != "version"}
        if not self.model_declarations:
            data["model_declarations"] = False
        if self.compile is not None:
            data["compile"] = self.compile.to_dict()
        if self.wrappers != "auto":
            data["wrappers"] = self.wrappers
        data["rules"] = [r.to_dict() for r in self.rules]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "policy") -> Policy:
        """A policy from its table; the document as a whole (its kind, version, keys and
        the type of every top-level value) is checked before any field is read."""
        _check_document(data, where)
        rules = data.get("rules", [])
        numerics = data.get("numerics")
        if numerics is not None:
            try:
                numerics = NumericSettings.from_dict(numerics)
            except ValueError as exc:
                raise PolicyError(f"{where} key 'numerics': {exc}") from None
        name = data.get("name", "custom")
        declared = data.get("model_declarations", True)
        compile_settings = data.get("compile")
        if compile_settings is not None and compile_settings is not False:
            compile_settings = CompileSettings.from_dict(compile_settings, f"{where} key 'compile'")
        return cls(
            rules=tuple(Rule.from_dict(r, f"{where} rules[{i}]") for i, r in enumerate(rules)),
            numerics=numerics,
            name=name,
            model_declarations=declared,
            compile=compile_settings or None,
            wrappers=data.get("wrappers", "auto"),
        )

    def to_toml(self) -> str:
        import tomli_w

        return tomli_w.dumps(self.to_dict())

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_toml(cls, text: str, where: str = "policy") -> Policy:
        try:
            return cls.from_dict(parse_checked(tomllib.loads, text, where), where)
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"{where}: malformed TOML: {exc}") from None
        except PolicyError:
            raise
        except ValueError as exc:  # nested too deeply
            raise PolicyError(str(exc)) from None

    @classmethod
    def from_json(cls, text: str, where: str = "policy") -> Policy:
        def parse(doc: str) -> Any:  # a key given twice in one object is refused, not silently overwritten
            return json.loads(doc, object_pairs_hook=lambda pairs: _unique_keys(pairs, where))

        try:
            return cls.from_dict(parse_checked(parse, text, where), where)
        except json.JSONDecodeError as exc:
            raise PolicyError(f"{where}: malformed JSON: {exc}") from None
        except PolicyError:
            raise
        except ValueError as exc:  # nested too deeply
            raise PolicyError(str(exc)) from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Policy:
        """Read a policy from a ``.toml`` or ``.json`` file."""
        p = Path(path)
        try:
            # A regular file of a sane size (not a directory, FIFO or /dev/zero); a byte-order mark is dropped.
            text = read_input_text(p, "policy file", text_kind="file")
        except ValueError as exc:
            raise PolicyError(str(exc)) from None
        if p.suffix.lower() == ".json":
            return cls.from_json(text, str(p))
        return cls.from_toml(text, str(p))

    def save(self, path: str | os.PathLike[str]) -> Path:
        p = Path(path)
        p.write_text(self.to_json() if p.suffix.lower() == ".json" else self.to_toml(), encoding="utf-8")
        return p

    def with_rules(self, *rules: Rule) -> Policy:
        """A copy with ``rules`` appended (so they win over earlier ones)."""
        return dataclasses.replace(self, rules=self.rules + tuple(rules))


#: The top-level keys of a policy document, and the type each value must have.
#: What :attr:`Policy.wrappers` may be.
WRAPPERS = ("auto", "none")

_DOCUMENT_KEYS: dict[str, tuple[tuple[type, ...], str]] = {
    "version": ((int,), "the integer 1"),
    "name": ((str,), "a string"),
    "numerics": ((dict,), "a table of float32 settings"),
    "model_declarations": ((bool,), "true or false"),
    "compile": ((dict, bool), "a table (mode, dynamic, backend) or true/false"),
    "wrappers": ((str,), "'auto' or 'none'"),
    "rules": ((list,), "an array of tables ([[rules]])"),
}


def _check_document(data: Any, where: str) -> None:
    """The checks on a policy document as a whole, before any field: it is a table; its
    version is one this mixprec reads (first, since another version may have other keys);
    it has no unknown keys; every top-level value and every rule has the right type."""
    if not isinstance(data, dict):
        raise PolicyError(f"{where}: expected a table (a policy document), got {type(data).__name__}")
    version = data.get("version", 1)
    if type(version) is not int:  # not True, not 1.0
        raise PolicyError(f"{where} key 'version': expected the integer 1, got {type(version).__name__} {quote(version)}")
    if version != 1:
        raise PolicyError(f"{where} key 'version': unsupported version {version}; this mixprec reads version 1 "
                          "(a newer mixprec wrote it? upgrade mixprec, or write the policy for version 1)")
    known = list(_DOCUMENT_KEYS)
    for key in data:
        if key not in known:
            raise PolicyError(f"{where}: unknown key {quote(key)}{did_you_mean(str(key), known)}; valid keys: {', '.join(known)}")
    for key, (types, words) in _DOCUMENT_KEYS.items():
        value = data.get(key)
        if key not in data or (value is None and key in ("numerics", "compile")):  # (JSON null: not set)
            continue
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise PolicyError(f"{where} key {key!r}: expected {words}, got {type(value).__name__} {quote(value)}")
    for i, rule in enumerate(data.get("rules") or ()):
        if not isinstance(rule, dict):
            raise PolicyError(f"{where} rules[{i}]: expected a table (match = ..., storage = ...), "
                              f"got {type(rule).__name__} {quote(rule)}")


def _unique_keys(pairs: list[tuple[str, Any]], where: str) -> dict[str, Any]:
    """A JSON object's members as a dict; a key given twice is an error (a JSON reader
    would keep only the last: a hand-merged ``"rules"`` would silently drop the first)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise PolicyError(f"{where}: key {quote(key)} appears twice in one JSON object (keys: "
                              f"{', '.join(quote(k, limit=30) for k, _ in pairs[:8])}{', ...' if len(pairs) > 8 else ''}); "
                              "only one would be read: merge them into one")
        seen[key] = value
    return seen
