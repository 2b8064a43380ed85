"""What every ``mixprec`` command shares: the consoles, safe printing, flag types and flag parsers.

Nothing here registers a command; the command modules import these helpers.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from mixprec._quote import quote
from mixprec.cli._choices import device_values, pipeline_values, size_help
from mixprec.cli._text import FitTable, SafeConsole, header_min_width, safe, say

#: Width when stdout is a pipe or a file (logs, CI) and COLUMNS is unset: rich's 80 columns
#: would wrap the benchmark tables cell by cell; a terminal keeps its own width.
PIPE_WIDTH = 180
console = SafeConsole(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else PIPE_WIDTH)
err_console = SafeConsole(stderr=True)


def fit_width() -> None:
    """Decide the console's width for the command about to run, from where its output goes now
    (a terminal or ``COLUMNS``: their width; a pipe or a file: :data:`PIPE_WIDTH`), not from
    where it went when the module was first imported (a test runner, an earlier command)."""
    console.width = None if console.file.isatty() or "COLUMNS" in os.environ else PIPE_WIDTH

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
#: Each closed set of values is listed from its source (:mod:`mixprec.cli._choices`).
DEVICES = " | ".join(device_values())
#: ``--pipeline`` of the commands that build one pipeline: a registered name or a factory.
PIPELINE_HELP = (f"Pipeline name: {', '.join(pipeline_values())} or a plugin's (see `mixprec pipelines`), or your "
                 "factory: module.path:factory or path/to/file.py:factory.")
SizeFlag = Annotated[str, typer.Option("--size", help=size_help())]
PipelineFlag = Annotated[str, typer.Option("--pipeline", help=PIPELINE_HELP)]
DeviceFlag = Annotated[Optional[str], typer.Option("--device", help=f"{DEVICES} (default: best available)")]
#: ``--device`` of the commands that measure and store (``bench``, ``tune``): the CPU unless asked.
MeasureDeviceFlag = Annotated[str, typer.Option("--device", help=f"{DEVICES}: where the pipeline is built and measured; stored with the run.")]
DbFlag = Annotated[Optional[str], typer.Option("--db", help="SQLite file (default: MIXPREC_DB, else bench.sqlite in the user data dir); created if missing; a folder you name must exist (mixprec creates only its own data folder).")]


def fail(exc: Exception | str) -> None:
    # The message repeats what the user passed (paths, values): printed as is, never as
    # Rich markup ("[red]p.toml" must not become "p.toml").
    say(err_console, ("error:", "bold red"), " ", str(exc))
    raise typer.Exit(code=2)


def table(title: str, columns: list[str], rows: list[list[Any]], *, drop: tuple[str, ...] = ()) -> FitTable:
    # Titles and cells hold user text (module names, paths, errors): never Rich markup,
    # control characters escaped (see cli._text). A cell may be a styled line(). Where the
    # terminal is too narrow, the columns named in ``drop`` are left out first, in order.
    return FitTable(title, columns, rows, _rich_table, drop=drop)


def _rich_table(title: Text, columns: list[str], rows: list[list[Text]]) -> Table:
    out = Table(title=title, title_justify="left", header_style="bold")
    for index, column in enumerate(columns):
        # The first column holds names (modules, settings): never cut them. A header is
        # never broken inside a word ("Configuratio n").
        out.add_column(safe(column), no_wrap=index == 0, overflow="fold", min_width=header_min_width(column))
    for row in rows:
        out.add_row(*row)
    return out


def gib(n: int | None) -> str | None:
    if n is None:
        return None
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


#: Upper bounds of counts given on the command line: past these a command would only
#: exhaust memory or time (a batch of 10**20 items, 10**12 timed runs). A batch is also
#: checked against free memory (``bench`` without --force-batch); this bound holds even then.
MAX_BATCH = 2**31 - 1
MAX_REPEAT = 100_000
MAX_SEED = 2**63 - 1
MAX_SEEDS = 1_000


def as_int(text: str, flag: str, *, low: int | None = None, high: int | None = None) -> int:
    """An integer flag value; with ``low``/``high``, one in that range (the error names both)."""
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"{flag} {quote(text)}: expected an integer") from None
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"from {low} to {high:,}" if low is not None and high is not None else (
            f"at most {high:,}" if high is not None else f"at least {low}")
        raise ValueError(f"{flag} {quote(text)}: expected an integer {bounds}")
    return value


def as_float(text: str, flag: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise ValueError(f"{flag} {quote(text)}: expected a number") from None


def int_list(text: str, flag: str, *, high: int | None = None) -> list[int]:
    values = [as_int(part, flag, high=high) for part in text.split(",") if part.strip()]
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{flag} {quote(text)}: expected comma-separated integers >= 1, e.g. 1,4")
    return values


def writable_path(path: str | None, flag: str) -> None:
    """Refuse, before any work, an output path that cannot be written (a whole search or run would be lost)."""
    if path is None:
        return
    if not path.strip():
        raise ValueError(f"{flag}: empty path")
    shown = quote(path, limit=300)
    try:
        _check_writable(Path(path).expanduser(), flag, shown)
    except OSError as exc:  # a name too long for the file system, a loop of links...
        raise ValueError(f"{flag} {shown}: cannot be used as a file name ({exc.strerror or exc})") from None


def _check_writable(target: Path, flag: str, shown: str) -> None:
    if target.is_dir():
        raise ValueError(f"{flag} {shown}: is a directory; give a file name")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.exists():
        raise ValueError(f"{flag} {shown}: directory {quote(str(parent), limit=300)} does not exist")
    if not parent.is_dir():
        raise ValueError(f"{flag} {shown}: {quote(str(parent), limit=300)} is a file, not a directory")
    if target.exists() and not os.access(target, os.W_OK):
        raise ValueError(f"{flag} {shown}: the file is not writable")
    if not target.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {shown}: cannot create files in {quote(str(parent), limit=300)}")


def open_store(db: str | None):
    from mixprec.bench.store import Store, StoreError

    try:  # the store checks its path (kind, folder, permissions) and schema before any work
        return Store(db, source="--db" if db is not None else None,
                     on_wait=lambda message: say(err_console, ("waiting:", "yellow"), " ", message))
    except (StoreError, ValueError) as exc:
        fail(exc)


def checked_device(device: str | None, flag: str = "--device") -> str:
    """The device a command builds its pipeline on, as torch names it (``cuda`` -> ``cuda``, ``None`` -> the best
    available); refused before any work where this machine cannot use it (the message names ``flag``, the value and why)."""
    from mixprec.device.hardware import resolve_device

    return str(resolve_device(device, source=flag))


def checked_pipeline(name: str, size: str, seed: int, batch: int, device: str | None) -> str:
    """The pipeline as worker processes get it: a registered name, or a factory spec with an absolute path.

    A factory is built and asked for example inputs once here, so that a broken
    one fails with its own error (exit status 2) instead of in every worker.
    """
    import gc

    from mixprec import pipelines

    if not pipelines.is_factory_spec(name):
        if name not in pipelines.available():
            pipelines.get(name)  # raises the registry's error, which lists the pipelines
        if size not in ("default", "test"):
            pipelines.get(name, size=size, seed=seed)  # an unknown size: the pipeline's own error, before any worker
            gc.collect()
        return name
    spec = pipelines.normalize_spec(name)
    pipe = pipelines.get(spec, size=size, seed=seed, **({"device": device} if device else {}))
    example_inputs(pipe, spec, batch, seed)
    del pipe
    gc.collect()
    return spec


def example_inputs(pipe: Any, name: str, batch: int, seed: int) -> Any:
    """``pipe.example_inputs(batch, seed)``; whatever the pipeline's own code raises becomes a ``ValueError`` naming it."""
    try:
        return pipe.example_inputs(batch, seed)
    except (ValueError, NotImplementedError):
        raise
    except Exception as exc:
        raise ValueError(f"pipeline {quote(name, limit=300)}: example_inputs(batch={batch}, seed={seed}) raised "
                         f"{type(exc).__name__}: {exc}") from None
