"""The ``mixprec`` command line: argument parsing and printing only.

Each command calls one library function and renders its result; human output is
rich tables, ``--json`` gives machines the same data. The commands live in one
module per group, which registers them on the root ``app`` when imported.
"""

from __future__ import annotations

import sys

# The order of these modules is the order of the commands in ``mixprec --help``.
from mixprec.cli import env, models, bench, tune, ui
from mixprec.cli._app import app

__all__ = ["app", "main", "env", "models", "bench", "tune", "ui"]


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    app(args=argv if argv is not None else sys.argv[1:], prog_name="mixprec")
