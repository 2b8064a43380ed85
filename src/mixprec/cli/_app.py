"""The root ``mixprec`` Typer app and its ``--version`` option.

The command modules register their commands on this app; ``mixprec.cli`` imports them.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperGroup

import mixprec
from mixprec._quote import quote
from mixprec.cli._common import console, err_console, fit_width
from mixprec.cli._text import clean, say

#: What an option read as text (so that it can give its own error) takes, as ``--help`` shows it;
#: a ``(command, option)`` row overrides the option's row. Flags take no value and show none.
METAVARS: dict[Any, str] = {
    "--repeat": "<int>", "--warmup": "<int>", "--seed": "<int>", "--top": "<int>", "--workers": "<int>",
    "--worker-cpus": "<int>", "--port": "<int>", "--batch": "<int,...>", "--seeds": "<int|int,...>",
    "--validation-seeds": "<int|int,...>", "--margin": "<dB>", "--min-quality": "<dB>", "--budget": "<duration>",
    "--max-quality-drop": "<percent>", "--max-latency-regression": "<percent>", "--max-memory-increase": "<percent>",
    "--max-failure-rate": "<percent>", "--memory-noise-floor": "<size>", "--timeout": "<seconds>",
    "--db": "<path>", "--html": "<path>", "--json": "<path>", "--csv": "<path>", "--out": "<path>", "--policy": "<path>",
    "--config": "<path>", "--env-file": "<path>", "--store-dir": "<path>",
    ("run", "--batch"): "<int>", ("tune", "--budget"): "<int>",
}

#: The exit status of a command the user interrupted (Ctrl-C): 128 + SIGINT, as a shell reports it.
INTERRUPTED = 130


def _metavars(command: Any, name: str) -> None:
    """Set each option's help type from :data:`METAVARS`; flags show none (not ``<bool>``)."""
    helper = command.get_help_option(command.context_class(command))  # made now (and kept) so that it shows no type
    for param in [*getattr(command, "params", ()), *([helper] if helper is not None else [])]:
        long = next((o for o in getattr(param, "opts", ()) if o.startswith("--")), None)
        if getattr(param, "is_flag", False) and not getattr(param, "count", False):
            param.metavar = ""
        elif long is not None and param.metavar is None:
            param.metavar = METAVARS.get((name, long), METAVARS.get(long))
    for sub_name, sub in (getattr(command, "commands", None) or {}).items():
        _metavars(sub, sub_name)


class _Group(TyperGroup):
    """The root command group: a usage error quotes what was typed with control characters escaped,
    ``--help`` shows each option's value type (:data:`METAVARS`), and a Ctrl-C ends any command with
    one line (what an interrupted run stored) and status :data:`INTERRUPTED`.

    Click puts the offending argument into its message ("Got unexpected extra argument (...)");
    parse errors of every sub-command pass through here. (Typer ships its own copy of Click,
    so its errors are recognised by their ``message`` and ``format_message``.)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _metavars(self, self.name or "mixprec")

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
        except KeyboardInterrupt as exc:  # Ctrl-C: one line, what was stored, and status 130 (no traceback)
            say(err_console, ("interrupted:", "bold yellow"), f" {exc}" if str(exc) else " stopped by the user (Ctrl-C)")
            raise typer.Exit(code=INTERRUPTED) from None


def _clean_message(exc: Exception) -> None:
    if isinstance(getattr(exc, "message", None), str) and callable(getattr(exc, "format_message", None)):
        _near_option(exc)
        exc.message = clean(exc.message, newlines=True)


def _near_option(exc: Any) -> None:
    """An unknown option that is a near miss of one the command has (``--float32_matmul_precision``,
    ``--Conv-TF32``, a look-alike or invisible character, a typo): said with the option meant and
    what differs, as every other source's near misses are (:mod:`mixprec.config.names`)."""
    from mixprec.config.names import closest, differences

    given, ctx = getattr(exc, "option_name", None), getattr(exc, "ctx", None)
    if not isinstance(given, str) or ctx is None or not hasattr(exc, "possibilities"):
        return
    options = [o for p in ctx.command.params for o in getattr(p, "opts", ()) if o.startswith("--")]
    found = closest(given, options)
    if found is None:
        return
    meant, same = found
    differ = [d for d in differences(given, meant) if "where the name has" not in d and "case" not in d] if same else []
    how = "; ".join([*differ, "flags are lower case, their words joined by '-'"]) if same else "a typo?"
    exc.message = f"No such option: {quote(given)}; did you mean {meant}? ({how})"
    exc.possibilities = []


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
    fit_width()
