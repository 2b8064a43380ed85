"""Translations of every visible string of the mixprec web UI.

The strings live in ``locales/<lang>.json``, one flat ``{key: text}`` mapping per
language; :func:`t` looks a key up and fills ``{placeholders}``.

Examples:
    >>> t("tab.run", "ja")
    '実行'
"""

from __future__ import annotations

from mixprec._languages import DEFAULT_LANGUAGE, LANGUAGES
from mixprec._quote import quote

import json
import re
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["DEFAULT_LANGUAGE", "FSI", "LANGUAGES", "PDI", "bidi", "check_language", "direction", "messages", "t"]

_RTL = frozenset({"he"})
#: Unicode FIRST STRONG ISOLATE and POP DIRECTIONAL ISOLATE: the text between them is laid out on its own.
FSI, PDI = "\u2068", "\u2069"
# A left-to-right run inside right-to-left text: from a Latin letter or digit to the last one before
# the next right-to-left letter, mark, isolate, table pipe, semicolon or line end (a number sign,
# currency sign or sign before it, and a percent or multiplication sign after it, stay with it).
_LTR_RUN = re.compile(r"(?:[#$€£]|[+\-−](?=[0-9]))?[A-Za-z0-9\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f](?:[^\u0590-\u08ff\ufb1d-\ufdff\ufe70-\ufeff\u200e\u200f\u2066-\u2069|;\n]*"
                      r"[A-Za-z0-9\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u024f%×])?")
_ISOLATED = re.compile(f"({FSI}[^{PDI}]*{PDI})")


def check_language(lang: str) -> str:
    """Return ``lang`` when it is supported.

    Raises:
        ValueError: naming the supported languages.
    """
    if lang not in LANGUAGES:
        raise ValueError(f"unsupported language {quote(lang)}; choose one of: {', '.join(LANGUAGES)}")
    return lang


@cache
def messages(lang: str) -> dict[str, str]:
    """All strings of one language (read once from its locale file; treat as read-only)."""
    text = resources.files("mixprec.ui").joinpath("locales", f"{check_language(lang)}.json").read_text("utf-8")
    return json.loads(text)


def t(key: str, lang: str = DEFAULT_LANGUAGE, **fmt: Any) -> str:
    """The text of ``key`` in ``lang``, with ``fmt`` filled into its placeholders.

    Args:
        key: a key of the locale files, e.g. ``"controls.init_button"``.
        lang: a code of :data:`LANGUAGES`.
        **fmt: values for the ``{name}`` placeholders.

    Raises:
        KeyError: when no locale defines ``key``.
        ValueError: for an unsupported language.
    """
    text = messages(lang)[key]
    return bidi(text.format(**fmt) if fmt else text, lang)


def _close_brackets(text: str, match: re.Match[str]) -> str:
    """The run, with the closing brackets that follow it when it opened them (``high (from argument x)``)."""
    run, end = match.group(), match.end()
    for opening, closing in ("()", "[]"):
        while run.count(opening) > run.count(closing) and text[end:end + 1] == closing:
            run, end = run + closing, end + 1
    return run


def bidi(text: str, lang: str) -> str:
    """``text`` laid out safely in ``lang``: in a right-to-left language every embedded left-to-right
    run (Latin words, numbers, code, paths) is wrapped in Unicode isolates, so its punctuation stays
    with it ("(from default)" does not lose its parenthesis to the start of the line); other languages
    get ``text`` unchanged. Applying it twice changes nothing more.

    Examples:
        >>> bidi("ב-fp32", "he") == "ב-\u2068fp32\u2069"
        True
    """
    if direction(lang) != "rtl":
        return text
    parts = []
    for part in _ISOLATED.split(text):
        if part.startswith(FSI) and part.endswith(PDI):
            parts.append(part)
            continue
        out, pos = [], 0
        while (match := _LTR_RUN.search(part, pos)) is not None:
            run = _close_brackets(part, match)
            out += [part[pos:match.start()], FSI, run, PDI]
            pos = match.start() + len(run)
        parts.append("".join(out) + part[pos:])
    return "".join(parts)


def direction(lang: str) -> str:
    """``"rtl"`` for right-to-left languages (Hebrew), else ``"ltr"``."""
    return "rtl" if check_language(lang) in _RTL else "ltr"
