"""What a benchmark store must be before anything in it is read or written.

:class:`~mixprec.bench.store.Store` runs two checks, in this order, and refuses with a
:class:`StoreError` that names where the path came from (``--db``, ``MIXPREC_DB``, a store
box), the path, what is wrong and what to do:

1. :func:`check_location`, before any file is opened: the path is a regular file or absent.
   A directory, a named pipe (FIFO: opening it would block until a writer came), a device or
   a socket is refused from its ``stat`` alone. An absent file is created, in a folder that
   exists: mixprec creates only its own data folder (where the default store lives); a folder
   named by ``--db``, ``MIXPREC_DB`` or a path passed to ``Store`` must exist already, so a
   mistyped folder is reported instead of being made.
2. :func:`schema_problems`, inside the first transaction, before any migration: a store
   that claims schema version *v* holds every table and column that version has (as
   :data:`~mixprec.bench.store.MIGRATIONS` built them), since every query reads them.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from functools import lru_cache
from pathlib import Path

from mixprec._quote import quote
from mixprec.policy.inputs import file_problem

__all__ = ["StoreError", "check_location", "default_store_folder", "schema_problems", "shown_path"]


class StoreError(RuntimeError):
    """The database file cannot be used; it was left untouched."""


def default_store_folder() -> Path:
    """mixprec's own data folder, which holds the default store (created when first needed)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("mixprec"))


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path quoted for a message: clipped when absurdly long, control and non-ASCII characters escaped."""
    return quote(os.fspath(path), limit=300)


def check_location(path: Path, source: str) -> None:
    """Refuse ``path`` unless it is a regular, readable and writable file, or absent in a folder that can hold it.

    Creates mixprec's own data folder when ``path`` is to be in it; nothing else is created or opened.

    Args:
        path: the store file.
        source: where the path came from, for messages (``--db``, ``MIXPREC_DB``, ``store path``).

    Raises:
        StoreError: naming ``source``, the path, the problem and what to do instead.
    """
    shown = f"{source} {shown_path(path)}"
    text = os.fspath(path)
    if not text.strip():
        raise StoreError(f"{source}: empty path; give the path of a SQLite file (a new one is created where none exists)")
    if "\x00" in text:
        raise StoreError(f"{shown}: a file name cannot contain a NUL character")
    try:
        mode = path.stat().st_mode  # stat only: a FIFO is never opened, so nothing blocks
    except (FileNotFoundError, NotADirectoryError):
        _check_folder(path, shown)
        return
    except OSError as exc:  # permission denied on a folder, a name too long, a loop of links
        raise StoreError(f"{shown}: cannot be used as a store ({exc.strerror or exc}); choose another path") from None
    if not stat.S_ISREG(mode):
        problem = file_problem(path) or "is not a regular file"
        what = "give a file name inside it, such as bench.sqlite" if stat.S_ISDIR(mode) else \
            "give the path of a SQLite file (a new one is created where none exists)"
        raise StoreError(f"{shown}: {problem}; {what}")
    if not os.access(path, os.R_OK):
        raise StoreError(f"{shown}: the file cannot be read (permission denied); fix its permissions or choose another path")
    if not os.access(path, os.W_OK):
        raise StoreError(f"{shown}: the file is not writable (a store records every run it is opened for); "
                         "fix its permissions or choose another path")


def _check_folder(path: Path, shown: str) -> None:
    parent = path.parent
    if parent.resolve() == default_store_folder().resolve():
        parent.mkdir(parents=True, exist_ok=True)
        return
    try:
        mode = parent.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        missing = _first_missing(parent)
        raise StoreError(f"{shown}: the folder {shown_path(missing)} does not exist; mixprec creates no folder but "
                         f"its own data folder: create it first (mkdir -p {shown_path(parent)}) or choose another path") from None
    except OSError as exc:
        raise StoreError(f"{shown}: the folder {shown_path(parent)} cannot be used ({exc.strerror or exc})") from None
    if not stat.S_ISDIR(mode):
        raise StoreError(f"{shown}: {shown_path(parent)} is a file, not a directory; choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StoreError(f"{shown}: cannot create files in {shown_path(parent)} (permission denied); choose another path")


def _first_missing(folder: Path) -> Path:
    """The outermost folder of ``folder`` that does not exist, or a file that stands where a folder should."""
    for candidate in reversed([folder, *folder.parents]):
        if not candidate.is_dir():
            return candidate
    return folder


@lru_cache(maxsize=None)
def expected_schema(migrations: tuple[str, ...], version: int) -> dict[str, frozenset[str]]:
    """Table -> column names of a store at schema ``version``, built by running ``migrations[:version]`` in memory."""
    db = sqlite3.connect(":memory:")
    try:
        for script in migrations[:version]:
            for statement in script.split(";"):
                if statement.strip():
                    db.execute(statement)
        return _schema(db)
    finally:
        db.close()


def _schema(db: sqlite3.Connection) -> dict[str, frozenset[str]]:
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")]
    return {t: frozenset(r[1] for r in db.execute(f"PRAGMA table_info({_ident(t)})")) for t in tables}


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def schema_problems(db: sqlite3.Connection, migrations: tuple[str, ...], version: int,
                    only: tuple[str, ...] | None = None) -> list[str]:
    """What a store at schema ``version`` lacks: ``table configs``, ``column runs.size``; empty when complete.

    ``only`` limits the check to those tables.
    """
    have = _schema(db)
    problems = []
    for table, columns in sorted(expected_schema(migrations, version).items()):
        if only is not None and table not in only:
            continue
        if table not in have:
            problems.append(f"table {table}")
            continue
        problems += [f"column {table}.{c}" for c in sorted(columns - have[table])]
    return problems
