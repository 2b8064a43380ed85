"""The documentation site builds in strict mode, with no warning at all, and reads as written.

``mkdocs build --strict`` (as ``make docs`` runs it) already fails on a broken link, a missing
anchor or a docstring mkdocstrings cannot read; this test also fails on any WARNING line it
prints. The site goes to a temporary folder, never to ``site/``. In the built pages, a nested
list comes out as a list inside a list item (Python-Markdown nests only what is indented by
four spaces), and a docstring's example comes out as a code block, one line per line (griffe
reads ``>>>`` lines as code only in an ``Examples:`` section). Two checks on the sources keep
those two rules for every page and docstring, mkdocs installed or not.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "mixprec"

needs_mkdocs = pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                                  reason="mkdocs is not installed (the docs extra)")

#: HTML elements that have no end tag.
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"}


class _Page(HTMLParser):
    """A built page as its text chunks, each with the elements open around it (outermost first);
    and the text of each ``<pre>`` that holds a ``<code>``."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.open: list[str] = []
        self.chunks: list[tuple[tuple[str, ...], str]] = []
        self.pres: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        if tag == "code" and "pre" in self.open and "code" not in self.open:
            self.pres.append("")
        if tag not in _VOID:
            self.open.append(tag)

    def handle_endtag(self, tag):
        if tag in self.open:
            while self.open.pop() != tag:
                pass

    def handle_data(self, data):
        self.chunks.append((tuple(self.open), data))
        if "pre" in self.open and "code" in self.open:
            self.pres[-1] += data

    def around(self, text: str) -> tuple[str, ...]:
        """The elements open around the first chunk that contains ``text``."""
        found = next((stack for stack, data in self.chunks if text in data), None)
        assert found is not None, f"no {text!r} on the page"
        return found


def _page(site: Path, name: str) -> _Page:
    return _Page((site / name / "index.html" if name else site / "index.html").read_text(encoding="utf-8"))


def _nesting(stack: tuple[str, ...]) -> int:
    """How many list items deep a chunk is."""
    return stack.count("li")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once for this module's tests: (its folder, what the build printed)."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (the docs extra)")
    folder = tmp_path_factory.mktemp("docs") / "site"
    # Material prints an upstream notice about its future on every build; the variable silences only that.
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return folder, output


@needs_mkdocs
def test_the_site_builds_strictly_without_warnings(site):
    folder, output = site
    warnings = [line for line in output.splitlines() if line.lstrip().upper().startswith("WARNING")]
    assert not warnings, "\n".join(warnings)
    assert (folder / "index.html").exists() and (folder / "api" / "apply" / "index.html").exists()


@needs_mkdocs
@pytest.mark.parametrize(("page", "parent", "items"), [
    ("", "Every preset is tested on real code", ("the real Chatterbox classes;", "Vocos;", "StableAudioPipeline")),
    ("policies", "It warns in two cases", ("The module computes in fp32.", "The module computes in 16 bits.")),
])
def test_nested_lists_come_out_as_lists_inside_a_list_item(site, page, parent, items):
    built = _page(site[0], page)
    outer = built.around(parent)
    assert _nesting(outer) == 1, outer
    for item in items:
        stack = built.around(item)
        assert _nesting(stack) == 2 and stack[:len(outer)] == outer, (item, stack)
        assert stack[len(outer):][:2] in (("ul", "li"), ("ol", "li")), (item, stack)


@needs_mkdocs
def test_docstring_examples_come_out_as_code_blocks_one_line_per_line(site):
    built = _page(site[0], "api/apply")
    example = next((text for text in built.pres if "calibrate=(input_ids,)" in text), None)
    assert example is not None, "mixprec.apply's example is not in a <pre><code> block"
    assert example.splitlines()[:3] == [
        '>>> with mixprec.apply(model, "fast", calibrate=(input_ids,)) as applied:',
        "...     print(applied.calibration.headline())",
        "...     model(input_ids)",
    ]


@needs_mkdocs
def test_no_docstring_example_of_the_api_reference_turns_into_a_quotation(site):
    """Markdown reads ``>>>`` outside a code block as three nested quotation marks."""
    folder = site[0] / "api"
    pages = sorted(p.parent.relative_to(site[0]).as_posix() for p in folder.rglob("index.html"))
    assert "api/apply" in pages and "api/pipelines" in pages
    quoted = [(page, data.strip()) for page in pages for stack, data in _page(site[0], page).chunks
              if data.strip() and ("blockquote" in stack or (">>>" in data and "pre" not in stack))]
    assert not quoted, quoted


_LIST_ITEM = re.compile(r"^( *)(?:[-*+]|\d+[.)]) ")


def _misindented_list_items(text: str) -> list[tuple[int, str]]:
    """Lines of a Markdown page (outside fenced code) that start a list item indented by other than a multiple of four."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        match = None if fenced else _LIST_ITEM.match(line)
        if match and len(match.group(1)) % 4:
            found.append((number, line))
    return found


def test_the_list_check_finds_a_two_space_nested_list():
    page = "- a parent:\n  - a child\n\n    - a grandchild, four spaces in\n```\n  - in code\n```\n"
    assert _misindented_list_items(page) == [(2, "  - a child")]


def test_every_nested_list_of_the_docs_is_indented_by_four_spaces():
    """Python-Markdown (MkDocs) folds a list indented by two spaces into its parent list; GitHub
    nests it. README.md is read on GitHub, every docs/ page through MkDocs."""
    pages = sorted((ROOT / "docs").rglob("*.md"))
    assert pages
    found = [f"{page.relative_to(ROOT)}:{number}: {line}" for page in pages
             for number, line in _misindented_list_items(page.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


def _docstrings(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield getattr(node, "name", "(module)"), text


def test_docstring_example_sections_are_named_examples():
    """griffe's Google style knows ``Examples:``; an ``Example:`` heading becomes an admonition
    whose ``>>>`` lines render as one flattened quotation (``Example::``, a reST literal block, is
    left alone: its indented lines stay a code block)."""
    found = [f"{path.relative_to(ROOT)}: {name}" for path in sorted(SRC.rglob("*.py"))
             for name, text in _docstrings(ast.parse(path.read_text(encoding="utf-8")))
             if re.search(r"^\s*Example:\s*$", text, re.MULTILINE)]
    assert not found, "\n".join(found)
