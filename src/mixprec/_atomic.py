"""Writing a small file whole or not at all: the one way mixprec replaces its cache and record files.

:func:`write_text` writes into a temporary file of its own in the target's folder (``mkstemp``: a
name no other process or thread can share), flushes it to disk and then gives it the target's name
(``os.replace``, atomic on one file system). A reader sees the old file or the new one, never half
of one; writers racing each other leave one whole file; a failed write (a full disk, text that
cannot be encoded) leaves the target as it was and no temporary file behind.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_text"]


def write_text(path: str | os.PathLike[str], text: str, *, mode: int | None = None) -> Path:
    """Replace ``path`` with ``text`` (UTF-8) atomically; ``mode``: its permission bits (default:
    the old file's, else what a new file gets under the umask). Raises ``OSError`` or
    ``UnicodeEncodeError`` with the target untouched."""
    target = Path(path)
    if mode is None:
        try:
            mode = target.stat().st_mode & 0o777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
    handle, name = tempfile.mkstemp(prefix=f".{target.name[:80]}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(name, mode)
        os.replace(name, target)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return target
