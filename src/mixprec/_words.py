"""Words a user typed, read the way a person reads them: one normalisation for every source.

A value such as a preset name or a matmul level arrives from the environment, a ``.env``
or TOML file, a flag, code or a web form. Copied from a web page or a chat it may carry
what nobody sees: a no-break space (``'fast\\u00a0'``), a zero-width space, fullwidth letters
(``'ｆａｓｔ'``). :func:`normalise` removes the invisible characters, strips surrounding
whitespace of every kind, applies Unicode NFKC and case-folds, so each of those reads as
``'fast'``; :func:`dropped` says what it removed, for a note.

A letter from another script that looks like a Latin one (a Cyrillic ``і`` in ``'hіgh'``)
is not the same word, and NFKC keeps it: :func:`look_alikes` names such characters and the
letter each resembles, so a refusal can say why a value that looks right is not.
:func:`skeleton` goes further for *names* (of settings, environment variables, keys): it
also maps look-alikes to the Latin letters, and ``-``, ``.`` and spaces to ``_``, so that
near misses of a name can be found whatever made them near.

Every layer may import this module: it imports nothing of mixprec.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

__all__ = ["normalise", "dropped", "invisible", "look_alikes", "describe", "skeleton", "edit_distance"]

#: Characters that take no room: zero-width spaces and joiners, the word joiner, the byte-order
#: mark, soft hyphen; any other format character (Unicode category ``Cf``) counts too.
_ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e")

#: Letters of other scripts that look like Latin ones (lower case; upper case is folded first).
_LOOK_ALIKE: dict[str, str] = {
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "һ": "h", "і": "i", "ї": "i", "ј": "j", "к": "k", "м": "m", "н": "h",
    "о": "o", "р": "p", "с": "c", "ѕ": "s", "т": "t", "у": "y", "х": "x", "ԁ": "d", "ԛ": "q", "ԝ": "w", "ӏ": "l",
    # Greek
    "α": "a", "β": "b", "ε": "e", "η": "n", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t", "υ": "u",
    "χ": "x", "ζ": "z", "μ": "u",
    # Latin letters and signs that pass for others
    "ı": "i", "ȷ": "j", "ł": "l", "ø": "o", "đ": "d", "ħ": "h",
}
#: Capital letters of other scripts that look like Latin capitals.
_LOOK_ALIKE_UPPER: dict[str, str] = dict(zip("АВЕНІЈКМОРСЅТХУΑΒΕΗΙΚΜΝΟΡΤΥΧΖ", "ABEHIJKMOPCSTXYABEHIKMNOPTYXZ"))
#: Separators a name may be written with instead of ``_``.
_SEPARATORS = "-. \t/"


@functools.cache
def _invisible_pattern() -> re.Pattern[str]:
    """Every character that takes no room (:data:`_ZERO_WIDTH` and Unicode's format characters),
    as one character class: removed in one pass of the regular-expression engine, where a
    Python test per character took seconds on a value of millions of characters."""
    format_characters = (chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf")
    return re.compile("[" + "".join(re.escape(c) for c in dict.fromkeys([*_ZERO_WIDTH, *format_characters])) + "]")


def invisible(text: str) -> list[str]:
    """The characters of ``text`` that take no room (zero-width, format characters)."""
    return [] if text.isascii() else _invisible_pattern().findall(text)


def normalise(text: str) -> str:
    """``text`` as a word to compare with a valid value: invisible characters removed,
    surrounding whitespace of every kind stripped (a no-break space included), NFKC, case-folded.

    Examples:
        >>> normalise(" FAST\\u00a0")
        'fast'
        >>> normalise("ｈｉ\\u200bgh")
        'high'
    """
    text = str(text)
    if text.isascii():  # no invisible character, and NFKC changes nothing: a word of any length in one pass
        return text.strip().casefold()
    return unicodedata.normalize("NFKC", _invisible_pattern().sub("", text)).strip().casefold()


def dropped(text: str) -> str:
    """What :func:`normalise` changed in ``text`` besides case and ASCII spaces, in words
    (``'\\xa0 (NO-BREAK SPACE) removed'``); empty when nothing else changed."""
    text = str(text)
    hidden = invisible(text)
    visible = _invisible_pattern().sub("", text) if hidden else text
    edges = visible[: len(visible) - len(visible.lstrip())] + visible[len(visible.rstrip()):]
    removed = list(dict.fromkeys(hidden + [c for c in edges if not c.isascii()]))
    notes = [", ".join(describe(c) for c in removed) + " removed"] if removed else []
    changed = list(dict.fromkeys(c for c in visible.strip() if unicodedata.normalize("NFKC", c) != c))
    if changed:
        notes.append(", ".join(f"{describe(c)} read as {unicodedata.normalize('NFKC', c)!r}" for c in changed[:3])
                     + (f" and {len(changed) - 3} more" if len(changed) > 3 else ""))
    return "; ".join(notes)


def look_alikes(text: str) -> list[tuple[str, str]]:
    """``(character, the Latin letter it looks like)`` for each look-alike in ``text``
    that NFKC keeps as it is (a Cyrillic ``і``, a Greek ``Η``)."""
    out = []
    for c in dict.fromkeys(unicodedata.normalize("NFKC", str(text))):
        latin = _latin(c)
        if latin is not None:
            out.append((c, latin))
    return out


def _latin(char: str) -> str | None:
    """The Latin letter ``char`` (not ASCII) looks like, or ``None``."""
    if char.isascii():
        return None
    return _LOOK_ALIKE_UPPER.get(char) or _LOOK_ALIKE.get(char.casefold())


def describe(char: str) -> str:
    """``'\\u0456 (CYRILLIC SMALL LETTER BYELORUSSIAN-UKRAINIAN I)'``: a character escaped, with its name."""
    escaped = ascii(char)[1:-1]
    name = unicodedata.name(char, "")
    return f"{escaped} ({name})" if name else escaped


def skeleton(name: str) -> str:
    """``name`` reduced to what a reader sees: :func:`normalise`, look-alikes mapped to the Latin
    letters they resemble, separators (``-``, ``.``, spaces) read as ``_``, repeated ``_`` as one,
    upper case. Two names with the same skeleton differ only in what makes them near misses.

    Examples:
        >>> skeleton("mixprec-float32-matmul-precіsion")
        'MIXPREC_FLOAT32_MATMUL_PRECISION'
    """
    visible = unicodedata.normalize("NFKC", "".join(c for c in str(name) if c not in invisible(str(name))))
    text = normalise("".join(_latin(c) or c for c in visible))
    for sep in _SEPARATORS:
        text = text.replace(sep, "_")
    while "__" in text:
        text = text.replace("__", "_")
    return text.strip("_").upper()


def edit_distance(a: str, b: str, *, limit: int = 3) -> int:
    """Edits (insert, delete, replace, swap two neighbours) from ``a`` to ``b``; ``limit + 1`` once past ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    previous2: list[int] | None = None
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (ca != cb))
            if previous2 is not None and i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], previous2[j - 2] + 1)
        if min(row) > limit:
            return limit + 1
        previous2, previous = previous, row
    return min(previous[-1], limit + 1)
