"""Checking what was typed into the UI, and small renderers the tabs share.

Every check returns a localized inline message instead of raising, so a handler
can show it and return before anything starts.

Examples:
    >>> whole(3.0, low=1, high=10)
    3
    >>> whole("x", low=1, high=10) is None
    True
"""

from __future__ import annotations

import base64
import html
import re
from typing import Any, Sequence

from mixprec._quote import clip
from mixprec.ui.i18n import t

__all__ = ["SIZES", "cancel_job", "check_choice", "check_whole", "devices", "error_text", "markdown_table", "png_html",
           "status_html", "store_location", "whole"]

#: Pipeline sizes offered; "test" is the quick default.
SIZES: tuple[str, ...] = ("test", "default")
_BOLD = re.compile(r"\*\*(.+?)\*\*")


def devices() -> list[str]:
    """Devices the Run, Benchmark and Tune tabs can build a pipeline on here: the CPU, and CUDA where torch sees a GPU."""
    import torch

    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def whole(value: Any, *, low: int, high: int) -> int | None:
    """``value`` as an int in ``[low, high]``, or ``None`` when it is not one.

    Accepts ints, integral floats (what ``gr.Number`` sends) and their text.
    """
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(str(value).strip()) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        return None
    if not number.is_integer() or not low <= number <= high:
        return None
    return int(number)


def check_whole(value: Any, field: str, lang: str, *, low: int, high: int) -> tuple[int | None, str | None]:
    """``(number, None)``, or ``(None, inline message)`` naming the field, the range and the value."""
    number = whole(value, low=low, high=high)
    if number is None:
        shown = "" if value is None else clip(value, escape=True)
        return None, t("form.error_number", lang, field=t(field, lang), low=low, high=high, value=shown)
    return number, None


def check_choice(value: Any, choices: Sequence[str], field: str, lang: str) -> str | None:
    """``None`` when ``value`` is one of ``choices``, else the inline message listing them."""
    if value in choices:
        return None
    return t("form.error_choice", lang, value="" if value is None else clip(value, escape=True), field=t(field, lang),
             choices=", ".join(choices))


def store_location(path: str | None) -> str:
    """The benchmark store typed into a tab, or the default store when the box is empty.

    While the server runs, only files in its store folder are allowed (see :mod:`mixprec.ui.stores`).

    Raises:
        ValueError: (a :class:`~mixprec.ui.stores.StoreLocationError`) for a path the server does not allow.
    """
    from mixprec.bench.store import default_db_path
    from mixprec.ui.stores import resolve_store

    return resolve_store(path, default_db_path())


def cancel_job(lang: str, job: Any, run_id: Any = None) -> str:
    """A Cancel button's handler: stop a run after its current step.

    Args:
        lang: language of the message.
        job: this session's :class:`mixprec.ui.jobs.Job`.
        run_id: empty or ``None``: this session's run; else the id a start returned, which finds
            that run in any session (an id that names no run in progress cancels nothing and says so).
    """
    wanted = "" if run_id is None else str(run_id).strip()
    if wanted:
        found = job.find(wanted)
        if found is None:
            return status_html(t("job.unknown", lang, field=t("job.run_id_label", lang), run_id=clip(wanted, escape=True)))
        job = found
    return status_html(t("job.cancelling" if job.cancel() else "job.idle", lang))


def error_text(key: str, lang: str, exc: BaseException) -> str:
    """The message ``key`` with the exception's type and text filled into ``{message}``."""
    return t(key, lang, message=f"{type(exc).__name__}: {exc}")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; pipes and newlines inside cells are escaped."""
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(cell, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def png_html(png: bytes, alt: str, elem_id: str) -> str:
    """An ``<img>`` holding the PNG inline (no temporary file)."""
    data = base64.b64encode(png).decode("ascii")
    return (f'<img id="{elem_id}" alt="{html.escape(alt, quote=True)}" '
            f'src="data:image/png;base64,{data}" style="max-width:100%">')


def status_html(text: str, fraction: float | None = None) -> str:
    """A status line (``**bold**`` kept) with a progress bar under it when ``fraction`` is given."""
    body = _BOLD.sub(r"<strong>\1</strong>", html.escape(text))
    bar = ""
    if fraction is not None:
        value = min(max(fraction, 0.0), 1.0)
        bar = f'<progress value="{value:.3f}" max="1" style="width:100%;height:1em"></progress>'
    return f'<div class="mixprec-status"><div class="mixprec-status-text">{body}</div>{bar}</div>'
