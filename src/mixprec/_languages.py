"""The languages of the web UI: read here without importing Gradio (``mixprec ui --lang`` names them)."""

from __future__ import annotations

__all__ = ["DEFAULT_LANGUAGE", "LANGUAGES"]

#: Supported languages: code -> the language's own name.
LANGUAGES: dict[str, str] = {"en": "English", "zh": "中文", "ja": "日本語", "he": "עברית"}
DEFAULT_LANGUAGE = "en"
