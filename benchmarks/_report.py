"""What every benchmark script does last: write its markdown table and print it."""

from __future__ import annotations

from pathlib import Path


def finish(lines: list[str], out: str | None) -> int:
    """Join ``lines``, write them to ``out`` (if given), print them; the script's exit status."""
    text = "\n".join(lines) + "\n"
    if out:
        Path(out).write_text(text)
    print(text)
    return 0
