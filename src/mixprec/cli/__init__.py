"""The ``mixprec`` command line: argument parsing and printing only.

Each command calls one library function and renders its result; human output is
rich tables, ``--json`` gives machines the same data. The commands live in one
module per group, which registers them on the root ``app`` when imported.
"""

from __future__ import annotations

import sys
import warnings

# The order of these modules is the order of the commands in ``mixprec --help``.
from mixprec.cli import env, models, calibrate, bench, tune, ui
from mixprec.cli._app import app

__all__ = ["app", "main", "env", "models", "calibrate", "bench", "tune", "ui"]


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point.

    Warnings (an ignored fallback store, a plugin that failed to load) quote paths and
    messages too: while the command runs they are printed like every other user text.
    """
    from mixprec.cli import _clock

    _clock.as_script = True
    _SAID.clear()
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        app(args=argv if argv is not None else sys.argv[1:], prog_name="mixprec")


#: The warnings a command has printed: a fact is said once per command, however often a library repeats it
#: (a model's deprecation warning on every call; a filter change inside mixprec re-arms Python's own "once").
_SAID: set[tuple[type, str]] = set()


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    from mixprec.cli._common import err_console
    from mixprec.cli._text import say

    key = (category, str(message))
    if key in _SAID:
        return
    _SAID.add(key)
    say(err_console, ("warning:", "yellow"), f" {message}")
