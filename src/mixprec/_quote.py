"""Quoting text a user gave inside a message: bounded in length, every character visible.

A message that repeats a user's input (a bound, a preset name, a module name, a value from
an environment variable) must stay readable whatever was typed: a two-megabyte value would
make a two-megabyte error, and a Cyrillic ``і`` in ``'hіgh'`` looks exactly like the valid
``'high'``. :func:`quote` writes the value as Python's :func:`ascii` does (quotes around it,
non-ASCII and control characters escaped: ``'h\\u0456gh'``) and clips it, saying how long
it was::

    >>> quote("sqnr>=" + "9" * 2_000_000, limit=12)
    "'sqnr>=999999…' (2,000,006 characters)"
    >>> quote("h\\u0456gh")
    "'h\\\\u0456gh'"

The ``…`` marking the cut is outside any escape and cannot come from the user's text
(theirs would read ``\\u2026``). :func:`clip` does the same cut without quoting, for text
already shown some other way (a path, a name inside a table). :func:`few` is the one way a
message about many things lists them: the first few named, the rest counted::

    >>> few(["fp32", "fast", "memory", "x", "y", "z"], listed=3)
    'fp32, fast, memory and 3 more'

Every layer may import this module: it imports nothing of mixprec.
"""

from __future__ import annotations

from typing import Any

__all__ = ["QUOTE_LIMIT", "LISTED", "quote", "clip", "few"]

#: The most characters of a user's value a message shows (escapes included, quotes not).
QUOTE_LIMIT = 80

_ELLIPSIS = "\u2026"

#: The most items a message names before it counts the rest (:func:`few`).
LISTED = 5


def quote(value: Any, *, limit: int = QUOTE_LIMIT) -> str:
    """``value`` quoted for a message: :func:`ascii`-escaped, clipped to ``limit`` characters.

    Args:
        value: the user's text; anything else is shown as its ``repr``, clipped the same way.
        limit: the most characters shown between the quotes (at least 1).

    Returns:
        ``'text'`` when short enough; otherwise ``'start…' (N characters)`` with ``N`` the
        length of the whole value.

    Examples:
        >>> quote("medium")
        "'medium'"
        >>> quote("x" * 500, limit=5)
        "'xxxxx…' (500 characters)"
    """
    limit = max(1, int(limit))
    if not isinstance(value, str):
        return clip(repr(value), limit=limit, escape=True)
    shown = ascii(value)
    if len(shown) - 2 <= limit:
        return shown
    keep = _longest_prefix(value, limit)
    head = ascii(value[:keep])
    return f"{head[:-1]}{_ELLIPSIS}{head[-1]} ({_length(value)})"


def clip(text: Any, *, limit: int = QUOTE_LIMIT, escape: bool = False) -> str:
    """``text`` cut to ``limit`` characters with ``… (N characters)`` after the cut; unquoted.

    Args:
        text: anything; shown as ``str(text)``.
        limit: the most characters kept.
        escape: show non-ASCII and control characters as escapes (``\\u0456``), as :func:`quote` does.
    """
    text = str(text)
    limit = max(1, int(limit))
    shown = _escaped(text) if escape else text
    if len(shown) <= limit:
        return shown
    if escape:
        keep = _longest_prefix(text, limit)
        return f"{_escaped(text[:keep])}{_ELLIPSIS} ({_length(text)})"
    return f"{text[:limit]}{_ELLIPSIS} ({_length(text)})"


def few(items: Any, *, listed: int = LISTED, sep: str = ", ", more: str = "more", show: Any = str) -> str:
    """The first ``listed`` of ``items`` joined by ``sep``, the rest counted: ``a, b, c and 49,997 more``.

    A message about many things (configurations, rules, names) stays short however many there are:
    50,000 configurations read as five names and a count, never as 50,000 names. Each named item is
    shown as ``show(item)`` (``str`` by default; :func:`quote` or :func:`clip` where it is the user's
    text), and only the named ones are: the rest are only counted.

    Args:
        items: any iterable; read once.
        listed: the most items named (at least 1).
        sep: what goes between the named items.
        more: the word after the count (``"more configurations"``).
        show: how a named item is written.

    Examples:
        >>> few(["a", "b"])
        'a, b'
        >>> few(map(str, range(50_000)), listed=3)
        '0, 1, 2 and 49,997 more'
    """
    listed = max(1, int(listed))
    shown: list[str] = []
    rest = 0
    for item in items:
        if len(shown) < listed:
            shown.append(show(item))
        else:
            rest += 1
    return sep.join(shown) + (f" and {rest:,} {more}" if rest else "")


def _length(text: str) -> str:
    return "1 character" if len(text) == 1 else f"{len(text):,} characters"


def _escaped(text: str) -> str:
    """``text`` escaped as :func:`ascii` escapes it, without the quotes it adds."""
    return ascii(text)[1:-1]


def _longest_prefix(value: str, limit: int) -> int:
    """The longest ``n`` whose escaped ``value[:n]`` fits in ``limit`` characters."""
    low, high = 0, min(len(value), limit)
    while low < high:
        mid = (low + high + 1) // 2
        if len(ascii(value[:mid])) - 2 <= limit:
            low = mid
        else:
            high = mid - 1
    return low
