"""The one place mixprec reads and writes torch's global numeric flags.

PyTorch has two families of getters and setters for float32 matmul / convolution
precision:

* the legacy ones: ``torch.set_float32_matmul_precision``,
  ``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``;
* since torch 2.9, the ``fp32_precision`` tree: ``torch.backends.fp32_precision``,
  ``torch.backends.cuda.matmul.fp32_precision``, ``torch.backends.cudnn.conv...``,
  ``torch.backends.mkldnn.matmul...`` and so on.

Writing a leaf of the tree directly (for example ``cuda.matmul.fp32_precision =
"tf32"``) makes later reads of the legacy getters raise ``RuntimeError`` ("mix of
the legacy and new APIs"), and libraries such as Lightning, transformers and
Inductor read those getters. The legacy setters, on the other hand, update the
matching leaves of the tree and leave both families readable, and they leave the
leaves they do not own (``mkldnn.conv``, the root, ...) as the application set
them. mixprec therefore writes only through ``set_float32_matmul_precision`` and
``cudnn.allow_tf32`` (plus the reduced-precision-reduction flags, which have no
tree counterpart), checks afterwards that every getter reads, and restores
snapshots node by node. On torch < 2.9 only the legacy family exists.

Every change made through :func:`apply_settings` or :func:`numerics` has an owner on
one per-process stack, and ends through :func:`restore` with the handle it returned (or
by leaving the ``with`` block). Owners ending in the order they started put back
exactly the snapshot taken before them. One that ends while a later one still holds
settings (two threads, an ``ExitStack`` unwound by hand, two policies reverted
first-in-first-out) withdraws only its own choices: each setting it chose goes back to
what it was before it, unless a later owner chose that setting too, the later owners
will put back the right values when they end, and a warning says so.

An owner started with ``keep_app_changes=True`` (an applied policy's numerics) leaves a
setting the application changed directly while it held it (``torch.set_float32_matmul_precision``
called after ``apply``) as the application set it when it ends, and warns naming the
setting, the application's value, the owner's and the one before it: the application's
later choice is its own, as a parameter it replaced is. ``numerics()`` blocks and other
owners put back exactly what was there before them.

Everything here takes an optional ``torch_module`` so the legacy-only path can be
exercised against a stand-in for an older torch.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Iterator, Protocol

import torch

from mixprec._signals import held_interrupt
from mixprec.device.settings import NumericSettings

__all__ = [
    "Snapshot",
    "TorchModule",
    "FlagReadError",
    "uses_fp32_precision_api",
    "read_legacy",
    "read_tree",
    "snapshot",
    "restore",
    "apply_settings",
    "current_settings",
    "numerics",
    "describe",
    "TREE_NODES",
]

#: Every node of the ``fp32_precision`` tree, parents before children.
TREE_NODES: tuple[tuple[str, str], ...] = (
    ("generic", "all"),
    ("cuda", "matmul"),
    ("cudnn", "all"),
    ("cudnn", "conv"),
    ("cudnn", "rnn"),
    ("mkldnn", "all"),
    ("mkldnn", "matmul"),
    ("mkldnn", "conv"),
    ("mkldnn", "rnn"),
)

_LEGACY_READERS = (
    "float32_matmul_precision",
    "cuda_matmul_allow_tf32",
    "cudnn_allow_tf32",
    "fp16_reduced_precision_reduction",
    "bf16_reduced_precision_reduction",
)


class FlagReadError(RuntimeError):
    """A torch numeric getter raised after mixprec wrote a flag."""


@dataclass(frozen=True)
class Snapshot:
    """Every torch numeric flag mixprec may touch, as read at one moment.

    Values that torch refused to read (its "mix of the legacy and new APIs"
    error) are stored as ``None`` in ``unreadable`` order so that ``restore``
    leaves them to the tree nodes, which are always readable.
    """

    legacy: dict[str, Any]
    tree: dict[str, str] = field(default_factory=dict)
    unreadable: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"legacy": dict(self.legacy), "tree": dict(self.tree), "unreadable": list(self.unreadable)}


class TorchModule(Protocol):
    """What ``torch_module`` must be: ``torch`` itself, or a stand-in that has its ``backends`` (the tests'
    older torch)."""

    backends: Any


def _torch(torch_module: ModuleType | Any | None) -> Any:
    return torch if torch_module is None else torch_module


def uses_fp32_precision_api(torch_module: Any | None = None) -> bool:
    """Whether this torch has the ``fp32_precision`` tree (torch >= 2.9).

    Asked of torch's compiled core (the tree's getter), not of ``torch.backends``: a plain
    ``fp32_precision`` attribute that code wrote onto an older torch's module is not the API.
    A stand-in module without ``_C`` (a test's simulated torch) is asked for the attribute.
    """
    t = _torch(torch_module)
    core = getattr(t, "_C", None)
    if core is not None:
        return hasattr(core, "_get_fp32_precision_getter")
    return hasattr(t.backends, "fp32_precision")


def _node(t: Any, backend: str, op: str) -> Any:
    obj = t.backends if backend == "generic" else getattr(t.backends, backend)
    return obj if op == "all" else getattr(obj, op)


def read_tree(torch_module: Any | None = None) -> dict[str, str]:
    """Read every ``fp32_precision`` node; empty on torch without the tree."""
    t = _torch(torch_module)
    if not uses_fp32_precision_api(t):
        return {}
    return {f"{b}.{o}": _node(t, b, o).fp32_precision for b, o in TREE_NODES}


def _legacy_getters(t: Any) -> dict[str, Any]:
    matmul = t.backends.cuda.matmul
    return {
        "float32_matmul_precision": t.get_float32_matmul_precision,
        "cuda_matmul_allow_tf32": lambda: matmul.allow_tf32,
        "cudnn_allow_tf32": lambda: t.backends.cudnn.allow_tf32,
        "fp16_reduced_precision_reduction": lambda: matmul.allow_fp16_reduced_precision_reduction,
        "bf16_reduced_precision_reduction": lambda: matmul.allow_bf16_reduced_precision_reduction,
    }


def read_legacy(torch_module: Any | None = None) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Read the legacy getters; returns (values, names torch refused to read)."""
    t = _torch(torch_module)
    values: dict[str, Any] = {}
    refused: list[str] = []
    with _quiet():
        for name, getter in _legacy_getters(t).items():
            try:
                values[name] = _normalise_reduction(getter())
            except RuntimeError:
                values[name] = None
                refused.append(name)
    return values, tuple(refused)


def _normalise_reduction(value: Any) -> Any:
    # Newer torch may report the reduced-precision flag as a (allow, allow_splitk) pair.
    if isinstance(value, tuple):
        return bool(value[0]) if len(value) == 1 else tuple(bool(v) for v in value)
    return value


def snapshot(torch_module: TorchModule | None = None) -> Snapshot:
    """Capture every numeric flag mixprec can change."""
    legacy, refused = read_legacy(torch_module)
    return Snapshot(legacy=legacy, tree=read_tree(torch_module), unreadable=refused)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # torch versions around 2.9 warn that the legacy TF32 API is deprecated; the
    # warning is about our internal choice of API, not something the user did.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*(TF32|tf32|fp32_precision|matmul precision).*")
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.backends.*")
        yield


def _write_reduction(t: Any, name: str, value: Any) -> None:
    setattr(t.backends.cuda.matmul, f"allow_{name}", value)


def restore(snap: Snapshot, torch_module: TorchModule | None = None) -> None:
    """Put every flag back exactly as it was when ``snap`` was taken.

    ``snap`` returned by :func:`apply_settings` ends that owner of the settings: see
    the module docstring for an owner that ends while a later one still holds settings.
    Any other snapshot is written back as it is.
    """
    with _owners_lock, held_interrupt():  # every flag back, or none: a Ctrl-C meanwhile is raised after
        owners = _owners(torch_module)
        index = next((i for i, owner in enumerate(owners) if owner.handle is snap), None)
        if index is None:
            _restore(snap, torch_module)
        else:
            _release(owners, index, torch_module)


def _restore(snap: Snapshot, torch_module: Any | None = None) -> None:
    """Write every flag of ``snap`` back (see :func:`restore`).

    The legacy setters run first (they also reset the matching tree leaves);
    then every tree node that still differs is written directly, parents before
    children. A state that the application itself left mixed (legacy getters
    raising) is therefore recreated as it was: mixprec's own writes never
    produce such a state, but restoring one is the caller's request.
    """
    t = _torch(torch_module)
    legacy = snap.legacy
    with _quiet():
        # A legacy value torch refused to read was never set through the legacy API
        # (the app used the tree): put torch's default underneath, then the tree on top.
        t.backends.cudnn.allow_tf32 = True if legacy.get("cudnn_allow_tf32") is None else legacy["cudnn_allow_tf32"]
        t.set_float32_matmul_precision(legacy.get("float32_matmul_precision") or "highest")
        for name in ("fp16_reduced_precision_reduction", "bf16_reduced_precision_reduction"):
            if legacy.get(name) is not None:
                _write_reduction(t, name, legacy[name])
        if snap.tree:
            for backend, op in TREE_NODES:
                key = f"{backend}.{op}"
                node = _node(t, backend, op)
                if node.fp32_precision != snap.tree[key]:
                    node.fp32_precision = snap.tree[key]


def apply_settings(settings: NumericSettings, torch_module: TorchModule | None = None, *, owner: str | None = None,
                   keep_app_changes: bool = False) -> Snapshot:
    """Write ``settings`` to torch and return the snapshot taken just before.

    All values are validated (``NumericSettings`` is already validated) before
    the first write. If torch rejects a write, or a getter stops reading
    afterwards, the previous state is restored and the error re-raised, so a
    setting is never left half-applied. ``restore`` of the returned snapshot ends
    this change; ``owner`` names it in the warning about owners ending out of order.
    With ``keep_app_changes``, a setting the application changes directly before that
    ``restore`` is left as the application set it (with a warning; see the module docstring).
    """
    label = owner or "apply_settings(" + ", ".join(f"{k}={getattr(settings, k)!r}" for k in _LEGACY_OF) + ")"
    return _acquire(settings, _FIELDS, label, torch_module, keep_app_changes)


def _write(settings: NumericSettings, torch_module: Any | None = None) -> Snapshot:
    """Write ``settings`` (no owner); returns the snapshot taken just before. Rolls back on failure."""
    t = _torch(torch_module)
    before = snapshot(t)
    try:
        with _quiet():
            t.backends.cudnn.allow_tf32 = settings.conv_tf32
            if "cudnn_allow_tf32" in read_legacy(t)[1]:
                # The app set a parent node of the tree (e.g. torch.backends.fp32_precision),
                # which the legacy cuDNN setter leaves in force: pin the cuDNN leaves too.
                leaf = "tf32" if settings.conv_tf32 else "ieee"
                t.backends.cudnn.conv.fp32_precision = leaf
                t.backends.cudnn.rnn.fp32_precision = leaf
            t.set_float32_matmul_precision(settings.matmul)
            _write_reduction(t, "fp16_reduced_precision_reduction", settings.fp16_reduced_precision_reduction)
            _write_reduction(t, "bf16_reduced_precision_reduction", settings.bf16_reduced_precision_reduction)
        _, refused = read_legacy(t)
        if refused:
            raise FlagReadError(
                f"after writing {settings} torch refuses to read {', '.join(refused)}; "
                "previous numeric state restored"
            )
    except BaseException:
        _restore(before, t)
        raise
    return before


# -- owners of the settings ----------------------------------------------------------------

#: NumericSettings fields, and the legacy getter each is read from in a Snapshot.
_LEGACY_OF = {
    "matmul": "float32_matmul_precision",
    "conv_tf32": "cudnn_allow_tf32",
    "fp16_reduced_precision_reduction": "fp16_reduced_precision_reduction",
    "bf16_reduced_precision_reduction": "bf16_reduced_precision_reduction",
}
_FIELDS = frozenset(_LEGACY_OF)


@dataclass(eq=False)
class _Owner:
    """One change of the settings that has not ended yet."""

    handle: Snapshot  # what the caller holds (apply_settings' return value), compared by identity
    label: str
    chosen: frozenset[str]  # the fields this owner chose; it wrote the others as it found them
    before: dict[str, Any]  # each field's value just before it wrote (from `handle`)
    #: Fields whose value in `handle` belonged to an owner that has ended since: put back after it.
    corrections: dict[str, Any] = field(default_factory=dict)
    #: What it wrote for each chosen field, where the app's direct changes are kept (else empty).
    wrote: dict[str, Any] = field(default_factory=dict)


#: The owners not ended yet, oldest first, per torch module (tests drive stand-ins for older torch).
_stacks: dict[int, list[_Owner]] = {}
_owners_lock = threading.RLock()


def _owners(torch_module: Any | None) -> list[_Owner]:
    return _stacks.setdefault(id(_torch(torch_module)), [])


def _values(snap: Snapshot) -> dict[str, Any]:
    values = {}
    for name, key in _LEGACY_OF.items():
        value = snap.legacy.get(key)
        if value is not None:
            values[name] = bool(value[0]) if isinstance(value, tuple) and name != "matmul" else value
    return values


def _acquire(settings: NumericSettings, chosen: frozenset[str], label: str, torch_module: Any | None,
             keep_app_changes: bool = False) -> Snapshot:
    """Write ``settings`` and record their owner, whole: a Ctrl-C meanwhile is raised once both are done,
    and undoes them (no setting is left half-applied, none without its owner)."""
    before = None
    try:
        with held_interrupt(), _owners_lock:
            before = _write(settings, torch_module)
            wrote = {name: getattr(settings, name) for name in chosen} if keep_app_changes else {}
            _owners(torch_module).append(_Owner(before, label, chosen, _values(before), wrote=wrote))
    except KeyboardInterrupt:
        if before is not None:
            restore(before, torch_module)
        raise
    return before


def _app_changes(owner: _Owner, torch_module: Any | None) -> dict[str, Any]:
    """The settings ``owner`` wrote that now read otherwise: the application changed them directly."""
    if not owner.wrote or read_legacy(torch_module)[1]:
        return {}  # not asked for, or the app mixed the flag APIs: the snapshot puts back the tree as it was
    current = _values(snapshot(torch_module))
    return {name: current[name] for name, value in owner.wrote.items() if name in current and current[name] != value}


def _release(owners: list[_Owner], index: int, torch_module: Any | None) -> None:
    owner = owners.pop(index)
    if index == len(owners):  # the newest: everything goes back as it was before it
        kept = _app_changes(owner, torch_module)
        _restore(owner.handle, torch_module)
        if owner.corrections:
            _write_fields(owner.corrections, torch_module)
        if kept:
            _write_fields(kept, torch_module)
            before = {**owner.before, **owner.corrections}
            warnings.warn(f"mixprec numerics: {owner.label} ended; kept "
                          + ", ".join(f"{name}={value!r} (set by the application after it started; it set "
                                      f"{owner.wrote[name]!r}, {before.get(name)!r} before it)" for name, value in kept.items())
                          + ": a setting the application changes itself stays as it set it", stacklevel=4)
        return
    # Ended while later owners hold settings: withdraw only this owner's own choices.
    withdrawn = {f: owner.corrections.get(f, owner.before.get(f)) for f in _LEGACY_OF
                 if f in owner.chosen and (f in owner.corrections or f in owner.before)}
    shadowed: dict[str, str] = {}
    for later in owners[index:]:
        for name, value in withdrawn.items():
            if name not in shadowed:
                later.corrections[name] = value  # its snapshot holds this owner's value for it
        for name in later.chosen & withdrawn.keys():
            shadowed.setdefault(name, later.label)
    now = {name: value for name, value in withdrawn.items() if name not in shadowed}
    current = _values(snapshot(torch_module))
    if now:
        _write_fields(now, torch_module)
    later = ", ".join(o.label for o in owners[index:])
    holders: dict[str, list[str]] = {}
    for name, label in shadowed.items():
        holders.setdefault(label, []).append(name)
    kept = "; ".join(f"kept {', '.join(names)} (held by {label})" for label, names in holders.items())
    put_back = ", ".join(f"{name}={value!r}" for name, value in now.items() if current.get(name) != value)
    warnings.warn(f"mixprec numerics: {owner.label} ended while {later}, started after it, still holds numeric settings; "
                  + (f"put back {put_back}" if put_back else "nothing to put back now")
                  + (f"; {kept}" if kept else "")
                  + ". End numeric settings in the reverse order they started (nested with blocks, revert the last "
                    "applied policy first) to avoid this", stacklevel=4)


def _write_fields(values: dict[str, Any], torch_module: Any | None) -> None:
    current = current_settings(torch_module) if not read_legacy(torch_module)[1] else NumericSettings()
    _write(current.replace(**values), torch_module)


def current_settings(torch_module: Any | None = None) -> NumericSettings:
    """The ``NumericSettings`` torch reports now (legacy getters, which mixprec keeps readable).

    Raises:
        FlagReadError: when the application has mixed the legacy and new APIs so
            that torch itself refuses to report the legacy values.
    """
    values, refused = read_legacy(torch_module)
    if refused:
        raise FlagReadError(
            f"torch refuses to read {', '.join(refused)} (the process mixed the legacy and new "
            "fp32_precision APIs); call mixprec.init() or mixprec.apply_settings() to put it in a consistent state"
        )
    fp16 = values["fp16_reduced_precision_reduction"]
    bf16 = values["bf16_reduced_precision_reduction"]
    return NumericSettings(
        matmul=values["float32_matmul_precision"],
        conv_tf32=bool(values["cudnn_allow_tf32"]),
        fp16_reduced_precision_reduction=bool(fp16[0] if isinstance(fp16, tuple) else fp16),
        bf16_reduced_precision_reduction=bool(bf16[0] if isinstance(bf16, tuple) else bf16),
    )


@contextlib.contextmanager
def numerics(
    matmul: str | None = None,
    *,
    conv_tf32: bool | str | None = None,
    fp16_reduced_precision_reduction: bool | str | None = None,
    bf16_reduced_precision_reduction: bool | str | None = None,
    torch_module: TorchModule | None = None,
) -> Iterator[NumericSettings]:
    """Temporarily change numeric flags; the exact previous state comes back on exit.

    Unset arguments keep their current value. The state is restored in a
    ``finally`` block, so also when the body raises.

    Examples:
        >>> with mixprec.numerics(matmul="high"):
        ...     y = model(x)
    """
    base = current_settings(torch_module) if not read_legacy(torch_module)[1] else NumericSettings()
    overrides = {
        "matmul": matmul,
        "conv_tf32": conv_tf32,
        "fp16_reduced_precision_reduction": fp16_reduced_precision_reduction,
        "bf16_reduced_precision_reduction": bf16_reduced_precision_reduction,
    }
    chosen = {k: v for k, v in overrides.items() if v is not None}
    wanted = base.replace(**chosen)
    label = "mixprec.numerics(" + ", ".join(f"{k}={getattr(wanted, k)!r}" for k in chosen) + ")"
    before = _acquire(wanted, frozenset(chosen), label, torch_module)
    try:
        yield wanted
    finally:
        restore(before, torch_module)


# What each fp32_precision value means for a backend, in words.
_MEANING = {
    "ieee": "full fp32 (IEEE)",
    "tf32": "TF32 allowed",
    "bf16": "bf16 internally",
    "none": "not set (follows parent / legacy flag)",
}


def _effective_leaf(tree: dict[str, str], backend: str, op: str) -> str:
    for key in (f"{backend}.{op}", f"{backend}.all", "generic.all"):
        value = tree.get(key, "none")
        if value != "none":
            return value
    return "ieee"


def describe(torch_module: TorchModule | None = None) -> dict[str, Any]:
    """The effective numeric state, as torch reports it now.

    Reads the flags back from torch rather than repeating what mixprec wrote:
    per backend (CUDA matmul, cuDNN conv, oneDNN matmul) the precision in force,
    the reduced-precision-reduction flags, the torch version and device.
    """
    t = _torch(torch_module)
    legacy, refused = read_legacy(t)
    tree = read_tree(t)
    if tree:
        backends = {
            "cuda_matmul": _effective_leaf(tree, "cuda", "matmul"),
            "cudnn_conv": _effective_leaf(tree, "cudnn", "conv"),
            "mkldnn_matmul": _effective_leaf(tree, "mkldnn", "matmul"),
        }
        api = "fp32_precision tree + legacy"
    else:
        level = legacy.get("float32_matmul_precision") or "highest"
        backends = {
            "cuda_matmul": "tf32" if legacy.get("cuda_matmul_allow_tf32") else "ieee",
            "cudnn_conv": "tf32" if legacy.get("cudnn_allow_tf32") else "ieee",
            "mkldnn_matmul": "bf16" if level == "medium" else "ieee",
        }
        api = "legacy"
    cuda = bool(getattr(t, "cuda", None) and t.cuda.is_available())
    device = t.cuda.get_device_name(0) if cuda else "cpu"
    return {
        "torch_version": str(t.__version__),
        "api": api,
        "device": device,
        "float32_matmul_precision": legacy.get("float32_matmul_precision"),
        "backends": backends,
        "backend_meaning": {k: _MEANING.get(v, v) for k, v in backends.items()},
        "fp16_reduced_precision_reduction": legacy.get("fp16_reduced_precision_reduction"),
        "bf16_reduced_precision_reduction": legacy.get("bf16_reduced_precision_reduction"),
        "cuda_matmul_allow_tf32": legacy.get("cuda_matmul_allow_tf32"),
        "cudnn_allow_tf32": legacy.get("cudnn_allow_tf32"),
        "unreadable_legacy_getters": list(refused),
        "fp32_precision_tree": tree,
    }
