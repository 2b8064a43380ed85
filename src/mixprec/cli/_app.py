"""The root ``mixprec`` Typer app and its ``--version`` option.

The command modules register their commands on this app; ``mixprec.cli`` imports them.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperGroup

import mixprec
from mixprec.cli._common import console
from mixprec.cli._text import clean, say

class _Group(TyperGroup):
    """The root command group: a usage error quotes what was typed with control characters escaped.

    Click puts the offending argument into its message ("Got unexpected extra argument (...)");
    parse errors of every sub-command pass through here. (Typer ships its own copy of Click,
    so its errors are recognised by their ``message`` and ``format_message``.)
    """

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except Exception as exc:
            _clean_message(exc)
            raise

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            _clean_message(exc)
            raise


def _clean_message(exc: Exception) -> None:
    if isinstance(getattr(exc, "message", None), str) and callable(getattr(exc, "format_message", None)):
        exc.message = clean(exc.message, newlines=True)


app = typer.Typer(
    cls=_Group,
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
