"""The ``ui`` command: serves the web UI (needs the optional ``ui`` dependencies)."""

from __future__ import annotations

from typing import Annotated

import typer

from mixprec.cli._app import app
from mixprec.cli._common import fail


@app.command("ui")
def ui_cmd(
    host: Annotated[str, typer.Option("--host", help="Interface to bind; anything but loopback exposes the UI to the network (warned).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 7860,
    lang: Annotated[str, typer.Option("--lang", help="Initial language: en, zh, ja or he.")] = "en",
) -> None:
    """Serve the web UI: run, benchmark, diagnose and tune in the browser (needs pip install 'mixprec\\[ui]')."""

    if not 1 <= port <= 65535:
        fail(ValueError(f"--port {port}: expected a TCP port from 1 to 65535"))

    try:
        from mixprec.ui.app import launch
        from mixprec.ui.i18n import check_language
    except ImportError as exc:
        fail(exc)
    try:
        check_language(lang)
    except ValueError as exc:
        fail(ValueError(f"--lang: {exc}"))
    launch(host=host, port=port, lang=lang)
