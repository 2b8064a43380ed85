"""The ``ui`` command: serves the web UI (needs the optional ``ui`` dependencies)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from mixprec._quote import quote
from mixprec.cli._app import app
from mixprec.cli._choices import join_or, language_values
from mixprec.cli._common import err_console, fail
from mixprec.cli._text import say


@app.command("ui")
def ui_cmd(
    host: Annotated[str, typer.Option("--host", help="Interface to bind; anything but loopback exposes the UI to the network (warned).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 7860,
    lang: Annotated[str, typer.Option("--lang", help=f"Initial language: {join_or(language_values())}.")] = "en",
    store_dir: Annotated[Optional[str], typer.Option("--store-dir", help="Folder the UI may create and open benchmark stores in (default: the user data folder of the default store); paths outside it are refused.")] = None,
) -> None:
    """Serve the web UI: run, benchmark, diagnose and tune in the browser (needs pip install 'mixprec\\[ui]')."""

    if not 1 <= port <= 65535:
        fail(ValueError(f"--port {port}: expected a TCP port from 1 to 65535"))

    if store_dir is not None:
        folder = Path(store_dir).expanduser()
        try:
            usable = bool(str(store_dir).strip()) and (not folder.exists() or folder.is_dir())
        except (OSError, ValueError) as exc:  # a name too long, a NUL byte
            fail(ValueError(f"--store-dir {quote(store_dir)}: cannot be used as a folder ({getattr(exc, 'strerror', None) or exc})"))
        if not usable:
            fail(ValueError(f"--store-dir {quote(store_dir)}: not a folder"))
    try:
        from mixprec.ui.app import PortInUseError, launch
        from mixprec.ui.i18n import check_language
    except ImportError as exc:
        fail(exc)
    try:
        check_language(lang)
    except ValueError as exc:
        fail(ValueError(f"--lang: {exc}"))
    try:
        launch(host=host, port=port, lang=lang, store_dir=store_dir)
    except PortInUseError as exc:
        fail(ValueError(f"--port {port}: {exc.strerror}; choose another with --port"))
    except OSError as exc:  # the store folder cannot be created, the address cannot be bound...
        fail(ValueError(f"cannot serve the UI on {host}:{port}: {exc}"))
    # The server stopped (Ctrl-C): a run still going ends as a cancel ends it, stored as cancelled.
    from mixprec.ui.jobs import stop_all

    running, left = stop_all()
    if running:
        say(err_console, f"stopped {running - left} run(s) in progress: stored as cancelled, with what they measured"
            + (f"; {left} did not stop in time and stay unfinished in the store" if left else ""))
