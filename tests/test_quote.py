"""mixprec._quote: every quoted value is bounded, escaped and says how long it was."""

from __future__ import annotations

import ast

from hypothesis import given, settings
from hypothesis import strategies as st

from mixprec._quote import QUOTE_LIMIT, clip, few, quote

_TEXT = st.one_of(st.text(max_size=300), st.text(alphabet=st.characters(codec="utf-8"), min_size=100, max_size=400),
                  st.builds(lambda a, n: a * n, st.text(min_size=1, max_size=3), st.integers(0, 5000)))


class TestQuote:
    @settings(max_examples=200, deadline=None)
    @given(value=_TEXT, limit=st.integers(1, 120))
    def test_bounded_ascii_and_faithful(self, value, limit):
        shown = quote(value, limit=limit)
        assert shown.replace("\u2026", "").isascii()  # only the cut mark is not ASCII
        if len(ascii(value)) - 2 <= limit:
            assert shown == ascii(value)
            assert ast.literal_eval(shown) == value  # what is shown is exactly what was given
        else:
            assert shown.endswith(f" ({len(value):,} character{'s' if len(value) > 1 else ''})")
            body = shown[: shown.rindex(" (")]
            assert body[-2] == "\u2026" and body[0] == body[-1]
            assert len(body) - 3 <= limit  # the escaped text kept, quotes and cut mark aside
            kept = ast.literal_eval(body[:-2] + body[-1])
            assert value.startswith(kept)

    def test_two_million_characters(self):
        shown = quote("sqnr>=" + "9" * 2_000_000)
        assert shown.startswith("'sqnr>=999") and shown.endswith("\u2026' (2,000,006 characters)")
        assert len(shown) < QUOTE_LIMIT + 40

    @given(value=st.one_of(st.integers(), st.lists(st.integers(), max_size=300), st.none()))
    def test_other_values_are_reprs(self, value):
        shown = quote(value, limit=20)
        assert shown == repr(value) if len(repr(value)) <= 20 else shown.startswith(repr(value)[:20] + "\u2026")

    @given(value=_TEXT, limit=st.integers(1, 120), escape=st.booleans())
    def test_clip(self, value, limit, escape):
        shown = clip(value, limit=limit, escape=escape)
        if escape:
            assert shown.replace("\u2026", "").isascii()
        whole = ascii(value)[1:-1] if escape else value
        if len(whole) <= limit:
            assert shown == whole
        else:
            tail = f"\u2026 ({len(value):,} character{'s' if len(value) > 1 else ''})"
            assert shown.endswith(tail) and len(shown) <= limit + len(tail)


class TestFew:
    """A message about many things names a few and counts the rest."""

    def test_names_a_few_and_counts_the_rest(self):
        assert few(["a", "b", "c"]) == "a, b, c"
        assert few([]) == ""
        assert few(map(str, range(50_000)), listed=3) == "0, 1, 2 and 49,997 more"
        assert few(range(7), sep="; ", more="more configurations") == "0; 1; 2; 3; 4 and 2 more configurations"

    def test_only_the_named_ones_are_shown(self):
        shown = []
        few(range(50_000), show=lambda i: shown.append(i) or str(i))
        assert shown == [0, 1, 2, 3, 4]

    @given(items=st.lists(st.text(max_size=5), max_size=60), listed=st.integers(1, 10))
    def test_bounded(self, items, listed):
        text = few(items, listed=listed)
        named = items[:listed]
        assert text.startswith(", ".join(named))
        assert text.endswith(f" and {len(items) - listed:,} more") if len(items) > listed else text == ", ".join(items)
