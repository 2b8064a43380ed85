"""Reading a file a user named (a policy, a config file, a ``.env`` file) as checked text.

Before a byte is read the path must be a regular file (not a directory, a named pipe
that would block, or a device such as ``/dev/zero`` that never ends) of a sane size.
The text is UTF-8; a leading byte-order mark is read and dropped. Parsers that
recurse (TOML, JSON) get :func:`parse_checked`, which turns a document nested past
the interpreter's recursion limit into a clear error instead of ``RecursionError``.
Every error is a :class:`ValueError` naming the file and what is wrong with it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Callable

from mixprec._quote import clip

__all__ = ["MAX_INPUT_BYTES", "file_problem", "read_input_text", "parse_checked"]

#: The largest settings file read (policies, configs and .env files are a few KiB; generated ones can be more).
MAX_INPUT_BYTES = 16 * 2**20

_BOM = "\ufeff"


def file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as a text file, or ``None`` when it is a regular file."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "does not exist"
    except NotADirectoryError:
        return "does not exist (a part of the path is a file, not a directory)"
    except PermissionError:
        return "cannot be read (permission denied)"
    except OSError as exc:  # a name too long, a loop of symbolic links...
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    if stat.S_ISFIFO(mode):
        return "is a named pipe (FIFO), not a regular file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is a device, not a regular file"
    if stat.S_ISSOCK(mode):
        return "is a socket, not a regular file"
    return "is not a regular file"


def read_input_text(path: str | os.PathLike[str], what: str, *, max_bytes: int = MAX_INPUT_BYTES,
                    text_kind: str | None = None) -> str:
    """The UTF-8 text of the regular file ``path`` (a byte-order mark dropped).

    Args:
        path: the file a user named.
        what: what it is, for messages: ``"policy file"``, ``"config file"``.
        max_bytes: larger files are refused before reading.
        text_kind: what the encoding error calls it (``not a UTF-8 text <text_kind>``); default ``what``.

    Raises:
        ValueError: naming the file and the problem (kind, size, encoding, permission).
    """
    p = Path(path)
    shown = _shown(p)
    problem = file_problem(p)
    if problem is not None:
        raise ValueError(f"{what} {shown} {problem}")
    size = p.stat().st_size
    if size > max_bytes:
        raise ValueError(f"{what} {shown} is {size:,} bytes; a {what} is read only up to {max_bytes:,} bytes")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {what} {shown}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{shown}: not a UTF-8 text {text_kind or what} "
                         f"(byte {exc.start} is {exc.object[exc.start]:#04x})") from None
    return text[1:] if text.startswith(_BOM) else text


def parse_checked(parse: Callable[[str], Any], text: str, where: str) -> Any:
    """``parse(text)``; a document nested deeper than the interpreter can follow is a ``ValueError``."""
    try:
        return parse(text)
    except RecursionError:
        raise ValueError(f"{where}: nested too deeply to read (settings files nest a few levels)") from None


def _shown(path: Path) -> str:
    return clip(str(path), limit=300, escape=True)  # control and non-ASCII characters escaped
