"""The one way the CLI writes files a user asked for (``--html``, ``--json``, ``--csv``, ``--out``).

A file that already exists is replaced atomically: the content goes to a temporary
file in the same directory, which then takes the target's name (``os.replace``), so
a full disk or an interrupted write never leaves half a report where a whole one was.
Special files (``/dev/stdout``, a named pipe) are written in place. When writing
fails, the error names the file and the reason (disk full, read-only, missing
directory) and says how to write it again; the work already done (a stored run, a
search) is kept, and the command ends with exit status 1 once the rest is printed.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable

from rich.console import Console

from mixprec._quote import quote
from mixprec.cli._text import say

__all__ = ["Outputs", "write_atomic", "describe_os_error", "write_run_exports"]

_REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EFBIG: "the file is larger than this system allows",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.ENOENT: "the directory does not exist",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EISDIR: "it is a directory",
    errno.ENAMETOOLONG: "the name is too long",
    errno.EIO: "an input/output error on the device",
}


def describe_os_error(exc: OSError) -> str:
    """A short reason for ``exc`` a person can act on: ``the disk is full (No space left on device)``."""
    reason = _REASONS.get(exc.errno or 0)
    detail = exc.strerror or str(exc)
    return f"{reason} ({detail})" if reason and detail else (reason or detail)


def write_atomic(path: str | os.PathLike[str], produce: Callable[[Path], None]) -> Path:
    """Write ``path`` with ``produce(target)``, atomically where it replaces a regular file.

    ``produce`` gets the path to write: a temporary file in the same directory that
    keeps the target's suffix (writers choose a format by it), or the target itself
    when that is a special file. Raises ``OSError`` (the temporary file removed).
    """
    target = Path(path).expanduser()
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))
        produce(target)  # a device or a pipe: written in place
        return target
    directory = target.parent if str(target.parent) else Path(".")
    handle, name = tempfile.mkstemp(prefix=f".{target.name[:80]}.", suffix=f".part{target.suffix}", dir=directory)
    os.close(handle)
    temp = Path(name)
    try:
        produce(temp)
        # mkstemp makes the file private; give it the mode a new file would have (or the old one's).
        os.chmod(temp, stat.S_IMODE(mode) if mode is not None else 0o666 & ~_umask())
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return target


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


class Outputs:
    """The files one command writes: each failure is reported, the command goes on.

    Examples:
        ```python
        outputs = Outputs(err_console)
        outputs.write(html, "--html", lambda p: p.write_text(page), again="mixprec runs show 3 --html out.html")
        outputs.finish()  # exit status 1 if any failed
        ```
    """

    def __init__(self, console: Console):
        self.console = console
        self.failed: list[str] = []

    def write(self, path: str | None, flag: str, produce: Callable[[Path], None], *, again: str | None = None) -> bool:
        if not path:
            return False
        try:
            write_atomic(path, produce)
        except OSError as exc:
            hint = f"; to write it again: {again}" if again else ""
            say(self.console, ("error:", "bold red"), f" {flag} {quote(path)} was not written: {describe_os_error(exc)}{hint}")
            self.failed.append(path)
            return False
        return True

    def write_text(self, path: str | None, flag: str, text: str, *, again: str | None = None) -> bool:
        return self.write(path, flag, lambda p: _write_text(p, text), again=again)

    def finish(self) -> None:
        """Exit with status 1 when any file could not be written (everything else was printed)."""
        if self.failed:
            import typer

            raise typer.Exit(code=1)


def _write_text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        if os.path.isfile(path):
            os.fsync(handle.fileno())  # a full disk shows here, not after the rename


def write_run_exports(outputs: Outputs, console: Console, runs: list[dict], *, html: str | None = None,
                      json_out: str | None = None, csv_out: str | None = None) -> None:
    """The reports of stored runs (``--html``, ``--json``, ``--csv``); a failed one says how to write it again."""
    from mixprec.bench import export, report

    ids = [run["id"] for run in runs]

    def again(option: str, path: str) -> str:
        redirect = " > " if option == "--json" else f" {option} "
        return " and ".join(f"mixprec runs show {i}{' --json' if option == '--json' else ''}{redirect}{_quoted(path)}"
                            for i in ids)

    if html and outputs.write_text(html, "--html", report.render_html(runs), again=again("--html", html)):
        say(console, f"report written to {html}")
    if json_out:
        outputs.write_text(json_out, "--json", export.to_json(runs), again=again("--json", json_out))
    if csv_out:
        outputs.write_text(csv_out, "--csv", export.to_csv(runs), again=again("--csv", csv_out))


def _quoted(path: str) -> str:
    import shlex

    return shlex.quote(path)
