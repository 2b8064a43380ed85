"""Translations of every visible string of the mixprec web UI.

The strings live in ``locales/<lang>.json``, one flat ``{key: text}`` mapping per
language; :func:`t` looks a key up and fills ``{placeholders}``.

Example:
    >>> t("tab.run", "ja")
    '実行'
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

__all__ = ["DEFAULT_LANGUAGE", "LANGUAGES", "check_language", "direction", "messages", "t"]

#: Supported languages: code -> the language's own name.
LANGUAGES: dict[str, str] = {"en": "English", "zh": "中文", "ja": "日本語", "he": "עברית"}
DEFAULT_LANGUAGE = "en"
_RTL = frozenset({"he"})


def check_language(lang: str) -> str:
    """Return ``lang`` when it is supported.

    Raises:
        ValueError: naming the supported languages.
    """
    if lang not in LANGUAGES:
        raise ValueError(f"unsupported language {lang!r}; choose one of: {', '.join(LANGUAGES)}")
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
    return text.format(**fmt) if fmt else text


def direction(lang: str) -> str:
    """``"rtl"`` for right-to-left languages (Hebrew), else ``"ltr"``."""
    return "rtl" if check_language(lang) in _RTL else "ltr"
