"""Near misses of a setting's name, found and said in one place for every source.

A name that is almost a setting's (an environment variable, a ``.env`` or TOML key, a
keyword from code or the command line) is a setting the user meant and mixprec would
silently ignore. :func:`closest` finds the name meant, whatever made the given one near:
case (``mixprec_preset``), a separator (``MIXPREC-PRESET``, ``float32-matmul-precision``),
a typo (``MIXPREC_PRESTE``), look-alike letters of another script (a Cyrillic ``Р``) or
invisible characters (a zero-width space). :func:`differences` says what differs, in words.

:func:`say_once` hands each note to its writer (a logger, the CLI's printer) once per
process, however often the settings are resolved (an app that calls ``mixprec.init`` on
every request, the UI's "Initialize service" button).
"""

from __future__ import annotations

import threading
import unicodedata
from typing import Callable, Iterable, Sequence

from mixprec._quote import quote
from mixprec._words import describe, edit_distance, invisible, look_alikes, skeleton

__all__ = ["closest", "differences", "suggestion", "say_once", "forget_said"]

#: Edits a name may be away from a setting's and still count as a typo of it: one per six
#: characters of the setting's name, at most two.
_MAX_EDITS = 2


def _allowed(name: str) -> int:
    return max(1, min(_MAX_EDITS, len(name) // 6))


def closest(given: str, names: Sequence[str]) -> tuple[str, bool] | None:
    """The name of ``names`` that ``given`` is a near miss of, and whether it is the same name
    read as a person reads it (case, separators, look-alikes, invisible characters: ``True``) or
    a typo of it (``False``); ``None`` when ``given`` is one of ``names`` or near none of them."""
    if given in names:
        return None
    shape = skeleton(given)
    same = [n for n in names if skeleton(n) == shape]
    if same:
        return same[0], True
    scored = sorted((edit_distance(shape, skeleton(n), limit=_MAX_EDITS), i) for i, n in enumerate(names))
    if scored and scored[0][0] <= _allowed(names[scored[0][1]]):
        return names[scored[0][1]], False
    return None


def differences(given: str, meant: str) -> list[str]:
    """What makes ``given`` differ from ``meant``, in words: invisible characters, look-alike
    letters, compatibility forms (fullwidth letters), separators, surrounding spaces, case."""
    out = []
    hidden = list(dict.fromkeys(invisible(given)))
    if hidden:
        out.append("invisible characters " + ", ".join(describe(c) for c in hidden[:3]))
    alike = look_alikes(given)
    if alike:
        out.append("look-alike letters " + ", ".join(f"{describe(c)} for {latin!r}" for c, latin in alike[:3]))
    forms = list(dict.fromkeys(c for c in given if not c.isascii() and unicodedata.normalize("NFKC", c) != c))
    if forms:
        out.append("other forms of letters " + ", ".join(f"{describe(c)} for {unicodedata.normalize('NFKC', c)!r}"
                                                        for c in forms[:3]))
    if given != given.strip():
        out.append("spaces around the name")
    separators = sorted({c for c in given.strip() if c in "-. /"})
    if separators or "__" in given:
        shown = ", ".join(repr(c) for c in separators) or "'__'"
        out.append(f"{shown} where the name has '_'")
    plain = "".join(c for c in given if c.isascii() and c not in "-. /").replace("__", "_").strip("_")
    if plain.upper() == meant.upper() and plain != meant:
        out.append("lower or mixed case" if meant.isupper() else "upper or mixed case")
    return out


def suggestion(given: str, names: Sequence[str]) -> str:
    """A ``" (did you mean 'X'? ...)"`` suffix naming the setting ``given`` is a near miss of, and what
    differs; ``""`` when it is near none."""
    found = closest(given, names)
    if found is None:
        return ""
    meant, same = found
    differ = differences(given, meant) if same else []
    return f" (did you mean {quote(meant)}?{' it has ' + '; '.join(differ) if differ else ''})"


_said: set[str] = set()
_lock = threading.Lock()


def say_once(notes: Iterable[str], write: Callable[[str], object]) -> list[str]:
    """Hand each of ``notes`` not yet said in this process to ``write``; returns those written."""
    fresh = []
    with _lock:
        for note in notes:
            if note not in _said:
                _said.add(note)
                fresh.append(note)
    for note in fresh:
        write(note)
    return fresh


def forget_said() -> None:
    """Say every note again from now on (for a process that starts over, such as a test)."""
    with _lock:
        _said.clear()
