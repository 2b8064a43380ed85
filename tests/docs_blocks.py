"""The code blocks of the project's Markdown: README.md, examples/README.md and every docs/**/*.md.

One reader for the tests that run them (tests/test_readme.py: shell commands; tests/test_docs_blocks.py:
Python and TOML blocks). A block is the text between a fence line (a line starting with three backticks,
then the language tag) and the next fence line. The line just before the opening fence may be an HTML comment
``<!-- not run: REASON -->``: the block is then shown, not run, for that reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READMES = ("README.md", "examples/README.md")
_NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.+?)\s*-->$")


def doc_files() -> tuple[str, ...]:
    """Every Markdown file whose code blocks the suite checks, relative to the repository root."""
    docs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
    return READMES + tuple(docs)


@dataclass(frozen=True)
class Block:
    file: str
    line: int  # the line of the opening fence, counted from 1
    lang: str
    text: str
    not_run: str | None  # the reason given in a ``<!-- not run: ... -->`` comment right before the block


def blocks(name: str) -> list[Block]:
    """The fenced code blocks of one file, in order."""
    lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
    found, start, lang, body = [], 0, "", None
    for number, line in enumerate(lines, start=1):
        if not line.startswith("```"):
            if body is not None:
                body.append(line)
            continue
        if body is None:
            start, lang, body = number, line[3:].strip(), []
            continue
        before = lines[start - 2].strip() if start >= 2 else ""
        reason = _NOT_RUN.match(before)
        found.append(Block(name, start, lang, "\n".join(body) + "\n", reason.group(1) if reason else None))
        body = None
    assert body is None, f"{name}:{start}: a code block is never closed"
    return found


def all_blocks() -> list[Block]:
    return [b for name in doc_files() for b in blocks(name)]
