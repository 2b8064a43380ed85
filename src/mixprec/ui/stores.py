"""Where the web UI may open benchmark stores, and the runs its views list.

Anyone who can reach the UI can type a path into a store box, and opening a store
creates the file. So while the server runs (:func:`stores_confined_to`, entered by
:func:`mixprec.ui.app.launch`), a store must be a file inside one folder: the
user data folder that holds the default store, or the folder the operator gave
with ``mixprec ui --store-dir``. Relative names are taken inside that folder.
Called from Python without the server, the handlers open any path they are given.

The run views list each run with its state (:func:`runs_with_states`): a run that did not finish,
measured nothing or timed nothing is never listed as if it were a result.

Examples:
    >>> with stores_confined_to("/srv/mixprec"):  # doctest: +SKIP
    ...     resolve_store("runs.sqlite")
    '/srv/mixprec/runs.sqlite'
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from mixprec._quote import quote

__all__ = ["StoreLocationError", "resolve_store", "runs_with_states", "state_key", "store_root", "stores_confined_to"]

#: Longest store path accepted (and quoted) from a text box.
MAX_PATH_CHARS = 1024

_root: Path | None = None


class StoreLocationError(ValueError):
    """The path typed into a store box is not allowed on this server; nothing was opened or created."""


@contextmanager
def stores_confined_to(root: str | os.PathLike[str]) -> Iterator[Path]:
    """While the block runs, stores are opened only inside ``root`` (created if missing); restored after."""
    global _root
    folder = Path(root).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    previous, _root = _root, folder.resolve()
    try:
        yield _root
    finally:
        _root = previous


def store_root() -> Path | None:
    """The folder stores are confined to, or ``None`` when any path may be opened."""
    return _root


def resolve_store(typed: str | None, default: Path) -> str:
    """The store file for what was typed (empty: ``default``, or ``bench.sqlite`` in the confining folder).

    Raises:
        StoreLocationError: a path outside the confining folder, a folder, or an absurd path
            (too long, a NUL byte); the message quotes the path clipped.
    """
    text = (typed or "").strip()
    root = _root
    if not text:
        if root is None or _inside(default.expanduser().resolve(), root):
            return str(default)
        return str(root / "bench.sqlite")
    if len(text) > MAX_PATH_CHARS or "\x00" in text:
        raise StoreLocationError(f"store path {quote(text)} is not a usable file name "
                                 f"(at most {MAX_PATH_CHARS} characters, no NUL)")
    if root is None:
        return text
    candidate = Path(text).expanduser()
    if not candidate.is_absolute():
        candidate = root / candidate
    resolved = candidate.resolve()  # symbolic links and '..' followed before the check
    if not _inside(resolved, root) or resolved == root:
        raise StoreLocationError(f"store path {quote(text)} is outside this server's store folder {quote(str(root), limit=300)} "
                                 "(its operator can choose the folder: mixprec ui --store-dir)")
    if resolved.is_dir():
        raise StoreLocationError(f"store path {quote(text)} is a folder; give a file name such as bench.sqlite")
    return str(resolved)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def runs_with_states(store: Any) -> list[dict[str, Any]]:
    """The runs of an open benchmark store, newest first, each with its ``state``, whether it is ``final``
    and why not (``state_text``): :func:`mixprec.bench.runstate.classify`, as ``mixprec runs list`` says it."""
    from mixprec.bench.runstate import with_states

    return with_states(store.runs(), store.load_run)


def state_key(state: str) -> str:
    """The locale key of a run state (:data:`mixprec.bench.runstate.STATES`): ``bench.state_nothing_measured``."""
    return "bench.state_" + state.replace(" ", "_")
