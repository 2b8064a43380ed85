"""The one way the CLI prints text it did not write itself.

Module names, paths, error messages, rule reasons, database contents and
configuration names come from users, models and files. Printed through Rich they
would be read as markup (``[/`` crashes with ``MarkupError``, ``[link=...]``
becomes a hyperlink) and their control characters (ESC, OSC, other C0/C1 codes,
bidirectional overrides) would reach the terminal. :func:`safe` turns such text
into a :class:`rich.text.Text` that is never parsed as markup and shows every
control character escaped (``\\x1b``), so what is printed is what was given.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from rich.console import Console
from rich.text import Text

__all__ = ["clean", "safe", "say", "line", "cells", "header_min_width", "json_text", "SafeConsole"]

# C0 controls except tab, DEL, C1 controls, and the Unicode format characters that
# reorder or hide text on a terminal (bidirectional overrides and isolates, line and
# paragraph separators, zero-width joiners are left alone: they are part of scripts).
# Lone surrogates (a file name with bytes that are not UTF-8, as Python decodes it) cannot be
# written to a UTF-8 terminal at all: they are shown escaped too.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\x1b": "\\x1b"}


def _escape(match: re.Match[str]) -> str:
    char = match.group(0)
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(value: Any, *, newlines: bool = False) -> str:
    """``value`` as text with every control character shown escaped.

    Args:
        value: anything; ``None`` reads ``-``.
        newlines: keep line breaks (a multi-line message); otherwise they read ``\\n``,
            so a table cell or a one-line status stays one line.
    """
    text = "-" if value is None else str(value)
    if newlines:
        return "\n".join(_CONTROL.sub(_escape, part) for part in text.split("\n"))
    return _CONTROL.sub(_escape, text)


def safe(value: Any, style: str = "", *, newlines: bool = False) -> Text:
    """``value`` as Rich text that is never read as markup (see :func:`clean`)."""
    if isinstance(value, Text):
        return value  # built by line(): its parts were cleaned when appended
    return Text(clean(value, newlines=newlines), style=style)


def line(*parts: Any) -> Text:
    """One line from parts: plain values are user text (escaped); ``(text, style)`` pairs are styled."""
    out = Text()
    for part in parts:
        if isinstance(part, tuple):
            out.append(clean(part[0], newlines=True), style=part[1])
        elif isinstance(part, Text):
            out.append_text(part)
        else:
            out.append(clean(part, newlines=True))
    return out


def say(console: Console, *parts: Any, soft_wrap: bool = True) -> None:
    """Print one line assembled by :func:`line`: no markup, no highlighting, no emoji codes."""
    console.print(line(*parts), highlight=False, markup=False, emoji=False, soft_wrap=soft_wrap)


def header_min_width(header: str) -> int:
    """The widest word of a column header: a table never breaks a header inside a word."""
    return min(24, max((len(word) for word in header.split()), default=1))


def cells(values: Iterable[Any]) -> list[Text]:
    return [safe(v) for v in values]


def json_text(text: str) -> str:
    """JSON text for a terminal: control characters inside strings as ``\\u`` escapes
    with four hex digits (still valid JSON).

    ``json.dumps(..., ensure_ascii=False)`` leaves C1 controls and bidirectional
    overrides raw; line breaks outside strings are the layout and stay.
    """
    return "\n".join(_CONTROL.sub(lambda m: f"\\u{ord(m.group(0)):04x}", part) for part in text.split("\n"))


class FitTable:
    """A table that never breaks a header inside a word: where the columns cannot fit the
    terminal at their headers' widths, each row is shown as a list of ``header  value`` lines.

    Rich squeezes columns to any width, down to nothing, when a table is wider than the
    console; a header then reads ``Configuratio n`` or disappears.
    """

    def __init__(self, title: str, columns: list[str], rows: list[list[Any]], build: Any):
        self.title = safe(title)
        self.columns = list(columns)
        self.rows = [[safe(v) for v in row] for row in rows]
        self.build = build  # (title, columns, rows) -> rich Table

    def needed_width(self) -> int:
        widths = [header_min_width(c) for c in self.columns]
        if self.columns:  # the first column (names) is never wrapped
            widths[0] = max([widths[0], *(row[0].cell_len for row in self.rows if row)])
        return sum(widths) + 3 * len(widths) + 1  # one space either side, one border per column and the last

    def __rich_console__(self, console: Console, options: Any):
        from rich import box
        from rich.table import Table

        if self.needed_width() <= options.max_width or not self.columns:
            yield self.build(self.title, self.columns, self.rows)
            return
        yield self.title
        for row in self.rows:
            card = Table(show_header=False, box=box.SIMPLE, pad_edge=False)
            card.add_column(no_wrap=True, style="bold")
            card.add_column(overflow="fold")
            for header, value in zip(self.columns, row):
                card.add_row(safe(header), value)
            yield card


class SafeConsole(Console):
    """A Rich console whose :meth:`print_json` keeps control characters out of the terminal.

    Rich re-serialises JSON with ``ensure_ascii=False``, which writes C1 controls,
    bidirectional overrides and lone surrogates raw (a surrogate even fails to encode).
    Here they are ``\\u`` escapes with four hex digits (``\\u0085``), so the output stays valid JSON a program can read.
    """

    def print_json(self, json: str | None = None, *, data: Any = None, indent: int | str | None = 2,
                   default: Any = None, sort_keys: bool = False, **_: Any) -> None:
        import json as json_module

        from rich.highlighter import JSONHighlighter

        value = json_module.loads(json) if json is not None else data
        text = json_module.dumps(value, indent=indent, ensure_ascii=False, default=default, sort_keys=sort_keys)
        shown = Text(json_text(text))
        JSONHighlighter().highlight(shown)
        self.print(shown, markup=False, highlight=False, emoji=False, soft_wrap=True)
