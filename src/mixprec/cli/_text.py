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

from rich.cells import cell_len
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


#: A cell up to this long is kept on one line; a longer one wraps between its words. A "word"
#: longer than this (a path, a hash, a long dotted name) is folded where it must be: columns
#: are never widened or dropped for it alone.
LONG_WORD = 24


def _lines(cell: Text) -> list[str]:
    return cell.plain.split("\n") or [""]


def _longest_word(cell: Text) -> int:
    """The narrowest the cell can be without breaking a word; a short cell (a number and its
    unit, an interval, a status) is one piece: ``774.4 MiB`` never reads ``774.4`` / ``MiB``."""
    if _natural(cell) <= LONG_WORD:
        return _natural(cell)
    return max((cell_len(word) for part in _lines(cell) for word in part.split()), default=0)


def _natural(cell: Text) -> int:
    return max(cell_len(part) for part in _lines(cell))


class FitTable:
    """A table that fits the terminal without breaking a word across lines.

    Each column gets at least its longest word (header included; words past
    :data:`LONG_WORD` characters count as that many and fold); the first column (names)
    is never wrapped. Where the columns cannot all fit so, columns are left out, ``drop``
    first (in its order) and then from the right, and a line under the table names them.
    Width left over goes first to the names, then to the columns that then need no
    wrapping at all. Only where not even the names and one more column fit is each row
    shown as ``header  value`` lines.
    """

    def __init__(self, title: str, columns: list[str], rows: list[list[Any]], build: Any, *, drop: Iterable[str] = ()):
        self.title = safe(title)
        self.columns = list(columns)
        self.rows = [[safe(v) for v in row] for row in rows]
        self.build = build  # (title, columns, rows) -> rich Table
        self.drop = [c for c in drop if c in self.columns]

    def _min(self, index: int, width: int) -> int:
        cells = [row[index] for row in self.rows if index < len(row)]
        words = max([header_min_width(self.columns[index]), *(min(LONG_WORD, _longest_word(c)) for c in cells)])
        if index == 0:  # names are not wrapped, unless one would take most of the line
            return max(words, min(max([0, *(_natural(c) for c in cells)]), max(LONG_WORD, int(width * 0.6))))
        return words

    def _natural(self, index: int) -> int:
        return max([cell_len(self.columns[index]), *(_natural(row[index]) for row in self.rows if index < len(row))])

    def needed_width(self, shown: list[int] | None = None, width: int = 10**6) -> int:
        """Columns at their minimum (their longest word), padding and borders: one space either side, a border per
        column and the last."""
        shown = list(range(len(self.columns))) if shown is None else shown
        return sum(self._min(i, width) for i in shown) + 3 * len(shown) + 1

    def layout(self, width: int) -> tuple[list[int], dict[int, int]] | None:
        """The columns shown at ``width`` and each one's width; None where not even the first fits."""
        shown = list(range(len(self.columns)))
        order = [self.columns.index(c) for c in self.drop] + [i for i in reversed(shown[1:]) if self.columns[i] not in self.drop]
        while self.needed_width(shown, width) > width and order:
            shown.remove(order.pop(0))
        if self.needed_width(shown, width) > width or len(shown) < min(2, len(self.columns)):
            return None  # names alone say nothing: each row as a card instead
        widths = {i: self._min(i, width) for i in shown}
        spare = width - self.needed_width(shown, width)
        # The names first, then the fewest wrapped columns.
        for i in sorted(shown, key=lambda i: (i != 0, self._natural(i) - widths[i])):
            grow = min(spare, self._natural(i) - widths[i])
            widths[i] += max(0, grow)
            spare -= max(0, grow)
        return shown, widths

    def __rich_console__(self, console: Console, options: Any):
        from rich import box
        from rich.table import Table

        fit = self.layout(options.max_width) if self.columns else None
        if fit is not None:
            shown, widths = fit
            out = self.build(self.title, [self.columns[i] for i in shown], [[row[i] for i in shown] for row in self.rows])
            for column, i in zip(out.columns, shown):
                column.width, column.min_width, column.overflow = widths[i], None, "fold"
                column.no_wrap = i == 0 and widths[i] >= self._natural(0)
            yield out
            left_out = [c for i, c in enumerate(self.columns) if i not in shown]
            if left_out:
                yield Text(f"  left out at {options.max_width} columns: {', '.join(left_out)} (a wider terminal shows "
                           "them)", style="dim")
            return
        if not self.columns:
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
