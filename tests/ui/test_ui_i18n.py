"""Locale files are complete, and the UI code shows no text that bypasses them."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("gradio")

from mixprec.ui import i18n  # noqa: E402

UI_DIR = Path(i18n.__file__).parent
LOCALES = UI_DIR / "locales"
#: Keyword arguments whose string value is shown to the user.
VISIBLE_KEYWORDS = {"label", "info", "title", "placeholder"}
#: Components whose first argument or ``value=`` is visible text.
TEXT_COMPONENTS = {"Tab", "TabItem", "Button", "Markdown", "HTML", "Accordion"}


def _load(lang: str) -> dict[str, str]:
    return json.loads((LOCALES / f"{lang}.json").read_text("utf-8"))


def test_locale_files_match_languages():
    assert sorted(p.stem for p in LOCALES.glob("*.json")) == sorted(i18n.LANGUAGES)


@pytest.mark.parametrize("lang", sorted(set(i18n.LANGUAGES) - {"en"}))
def test_same_keys_as_english(lang):
    en, other = _load("en"), _load(lang)
    assert sorted(set(en) - set(other)) == [], "missing keys"
    assert sorted(set(other) - set(en)) == [], "extra keys"


@pytest.mark.parametrize("lang", sorted(i18n.LANGUAGES))
def test_no_empty_strings_and_same_placeholders(lang):
    import string

    en, other = _load("en"), _load(lang)
    for key, text in other.items():
        assert isinstance(text, str) and text.strip(), key
        fields = {f for _, f, _, _ in string.Formatter().parse(text) if f}
        want = {f for _, f, _, _ in string.Formatter().parse(en[key]) if f}
        assert fields == want, key


@pytest.mark.parametrize("lang", ["zh", "ja", "he"])
def test_translations_are_translated(lang):
    en, other = _load("en"), _load(lang)
    same = [k for k in en if en[k] == other[k] and k not in {"bench.col_id"}]
    assert same == []


def test_t_formats_and_direction():
    assert i18n.t("bench.none", "en", path="x.sqlite") == "No runs found in x.sqlite."
    assert i18n.direction("he") == "rtl"
    assert {i18n.direction(code) for code in ("en", "zh", "ja")} == {"ltr"}
    with pytest.raises(ValueError):
        i18n.t("tab.run", "fr")


def _is_text(node: ast.AST | None) -> bool:
    """A literal that would reach the screen: a non-empty string or an f-string."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and bool(node.value.strip())
    return isinstance(node, ast.JoinedStr)


def visible_literals(source: str) -> list[str]:
    """Places in ``source`` where a Gradio call (``gr.X(...)``) gets literal visible text."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if not (isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "gr"):
            continue
        name = func.attr
        for kw in node.keywords:
            visible = kw.arg in VISIBLE_KEYWORDS or (kw.arg == "value" and name in TEXT_COMPONENTS)
            if visible and _is_text(kw.value):
                found.append(f"line {node.lineno}: {name}({kw.arg}=...)")
        if name in TEXT_COMPONENTS and node.args and _is_text(node.args[0]):
            found.append(f"line {node.lineno}: {name}(<literal>)")
    return found


def used_keys(source: str) -> set[str]:
    keys = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "t" and node.args:
            if isinstance(node.args[0], ast.Constant):
                keys.add(node.args[0].value)
    return keys


def test_checker_catches_literals():
    bad = 'import gradio as gr\ngr.Button("Run")\ngr.Dropdown([], label="Pick")\ngr.Markdown(value=f"x{1}")\ngr.Tab("Run")\n'
    assert len(visible_literals(bad)) == 4
    good = 'gr.Button(t("run.button", lang))\ngr.Dropdown([], label=t("run.size_label", lang), value="fp32")\n'
    assert visible_literals(good) == []


#: Every module of the UI, and the public re-export module.
UI_MODULES = sorted(UI_DIR.glob("*.py")) + [UI_DIR.parent / "gradio.py"]


def test_every_ui_module_is_checked():
    names = {p.name for p in UI_MODULES}
    assert {"app.py", "controls.py", "bench_tab.py", "tune_tab.py", "forms.py", "jobs.py", "gradio.py"} <= names


@pytest.mark.parametrize("module", UI_MODULES, ids=lambda p: p.name)
def test_ui_code_has_no_visible_literals(module):
    source = module.read_text("utf-8")
    assert visible_literals(source) == []
    assert used_keys(source) - set(_load("en")) == set(), "t() with a key no locale defines"


def test_keys_built_from_names_exist():
    """Keys the tabs build at run time (table headers, statuses, objectives) are in every locale."""
    from mixprec.ui import bench_tab, tune_tab

    built = {f"bench.tcol_{c}" for c in bench_tab.TABLE_COLUMNS}
    built |= {f"bench.status_{s}" for s in ("ok", "failed", "timeout", "running", "complete", "cancelled", "incomplete",
                                                  "not_measured")}
    built |= {f"tune.objective_{o}" for o in tune_tab.OBJECTIVES}
    built |= {f"tune.col_{c}" for c in ("index", "step", "latency", "weights", "meets")}
    for lang in i18n.LANGUAGES:
        assert built - set(_load(lang)) == set(), lang


_HEBREW = st.sampled_from(list("אבגדהוזחטיכלמנסעפצקרשת"))
_LATIN = st.sampled_from(list("abcxyzABC0123456789"))
_NEUTRAL = st.sampled_from(list(" .,:=()[]-_%×#*\"'/"))


class TestBidi:
    """Latin runs inside right-to-left text are isolated, and only they."""

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.one_of(_HEBREW, _LATIN, _NEUTRAL), max_size=60).map("".join))
    def test_hebrew_text_keeps_its_characters_and_isolates_every_latin_run(self, text):
        out = i18n.bidi(text, "he")
        assert out.replace(i18n.FSI, "").replace(i18n.PDI, "") == text
        assert i18n.bidi(out, "he") == out  # applying it again changes nothing
        inside, depth = [], 0
        for ch in out:
            if ch == i18n.FSI:
                assert depth == 0
                depth, run = 1, []
            elif ch == i18n.PDI:
                assert depth == 1
                depth = 0
                inside.append("".join(run))
            elif depth:
                run.append(ch)
            else:
                assert not ("a" <= ch.lower() <= "z" or ch.isdigit()), (ch, out)  # every Latin letter and digit is isolated
        assert depth == 0
        for run in inside:
            assert not any("\u0590" <= ch <= "\u05ff" for ch in run)  # no Hebrew inside an isolate
            assert run[0].isalnum() or run[0] in "#+-", run
            assert run[-1].isalnum() or run[-1] in "%×)]", run
            if run.endswith(")"):  # a closing bracket at the end comes along only with its opening one
                assert run.count("(") >= run.count(")"), run

    @pytest.mark.parametrize("text, expected", [
        ("חישוב קשב (attention) ב-fp32", "חישוב קשב (\u2068attention\u2069) ב-\u2068fp32\u2069"),
        ("מקור: float32 = high (from argument x).", "מקור: \u2068float32 = high (from argument x)\u2069."),
        ("הרצה #12 נשמרה", "הרצה \u2068#12\u2069 נשמרה"),
        ("האצה **1.78×**, משקלים **52%**", "האצה **\u20681.78×\u2069**, משקלים **\u206852%\u2069**"),
        ("| a | ב |", "| \u2068a\u2069 | ב |"),  # table pipes stay outside
    ])
    def test_examples(self, text, expected):
        assert i18n.bidi(text, "he") == expected

    @pytest.mark.parametrize("lang", ["en", "zh", "ja"])
    @settings(max_examples=50, deadline=None)
    @given(text=st.text(max_size=40))
    def test_left_to_right_languages_are_unchanged(self, lang, text):
        assert i18n.bidi(text, lang) == text

    @pytest.mark.parametrize("key", sorted(_load("he")))
    def test_every_hebrew_text_comes_isolated(self, key):
        import string

        fields = {f: "x1" for _, f, _, _ in string.Formatter().parse(_load("he")[key]) if f}
        shown = i18n.t(key, "he", **fields)
        outside = "".join(i18n._ISOLATED.split(shown)[::2])
        assert not any("a" <= ch.lower() <= "z" for ch in outside), (key, shown)
