"""The ``mixprec`` command's entry point, kept outside the ``mixprec`` package.

Starting the command imports ``mixprec`` and torch, which takes seconds. A Ctrl-C then
would end it with a traceback from inside torch, before any code of the package could
answer it. This module imports nothing heavy: it catches that interrupt, as the command
itself catches one at any later moment, and ends with one line and status 130.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import signal
import sys

#: The exit status of an interrupted command (Ctrl-C): 128 + SIGINT, as a shell reports it.
INTERRUPTED = 130


def _stopped(signum: int, frame: object) -> None:
    """A Ctrl-C once the command has finished (Python is exiting: its atexit handlers stop the
    workers): end now, quietly, with the interrupted status."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(INTERRUPTED)


def _version() -> str | None:
    """The package's version read from ``mixprec/_version.py`` without importing the package (and
    torch with it: two seconds of CPU), or ``None`` where that file cannot be found."""
    spec = importlib.util.find_spec("mixprec")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, "_version.py")
        if os.path.isfile(path):
            return str(runpy.run_path(path)["__version__"])
    return None


def main() -> None:
    """Run the ``mixprec`` command (:func:`mixprec.cli.main`); ``mixprec --version`` alone is
    answered here, as the command answers it, without starting the package."""
    if sys.argv[1:] == ["--version"]:
        version = _version()
        if version is not None:
            print(f"mixprec {version}")
            return
    try:
        try:
            from mixprec.cli import main as command
        except KeyboardInterrupt:
            print("interrupted: stopped by the user (Ctrl-C) while mixprec started", file=sys.stderr)
            sys.exit(INTERRUPTED)
        command()
    except KeyboardInterrupt:  # the command answers its own; this one came between its parts
        print("interrupted: stopped by the user (Ctrl-C)", file=sys.stderr)
        sys.exit(INTERRUPTED)
    finally:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _stopped)


if __name__ == "__main__":
    main()
