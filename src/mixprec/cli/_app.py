"""The root ``mixprec`` Typer app and its ``--version`` option.

The command modules register their commands on this app; ``mixprec.cli`` imports them.
"""

from __future__ import annotations

from typing import Annotated

import typer

import mixprec
from mixprec.cli._common import console
from mixprec.cli._text import say

app = typer.Typer(
    name="mixprec",
    help="Safe, fast and measurable reduced-precision inference for PyTorch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version_callback(value: bool) -> None:
    if value:
        say(console, f"mixprec {mixprec.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Show the version and exit.")] = False,
) -> None:
    """Safe, fast and measurable reduced-precision inference for PyTorch."""
