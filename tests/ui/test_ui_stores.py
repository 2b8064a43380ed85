"""The run views of the web UI: each stored run listed with its state in the page's language, and a run
that is not a final result said to be one neither in the list nor in its report."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

gr = pytest.importorskip("gradio")

from mixprec.bench import runstate  # noqa: E402
from mixprec.bench.store import Store  # noqa: E402
from mixprec.ui import i18n  # noqa: E402
from mixprec.ui.bench_tab import list_runs, show_run  # noqa: E402
from mixprec.ui.stores import runs_with_states, state_key  # noqa: E402
from run_states import RUNS, store_of_states  # noqa: E402

LOCALES = Path(i18n.__file__).parent / "locales"


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    path = tmp_path_factory.mktemp("states") / "s.sqlite"
    return str(path), store_of_states(path)


def test_every_state_has_its_words_in_every_language():
    for lang in i18n.LANGUAGES:
        keys = json.loads((LOCALES / f"{lang}.json").read_text("utf-8"))
        assert {state_key(s) for s in runstate.STATES} | {"bench.col_state", "bench.state_note"} <= set(keys), lang


def test_the_views_data_carries_each_runs_state(stored):
    path, ids = stored
    with Store(path) as store:
        rows = {row["id"]: row for row in runs_with_states(store)}
    for state in RUNS:
        assert rows[ids[state]]["state"] == state
        assert rows[ids[state]]["final"] is (state in ("complete", "older record"))


@pytest.mark.parametrize("lang", i18n.LANGUAGES)
def test_the_list_says_each_state_in_the_pages_language(lang, stored):
    path, ids = stored
    text, choices = list_runs(path, lang=lang)
    assert sorted(value for _, value in choices) == sorted(ids.values())
    for state in RUNS:
        assert i18n.t(state_key(state), lang) in text, state
    assert i18n.t("bench.state_note", lang) in text and i18n.t("bench.col_state", lang) in text


def test_a_list_of_results_only_has_no_note(tmp_path):
    path = tmp_path / "one.sqlite"
    from run_states import write_run

    with Store(path) as store:
        write_run(store, "complete")
    text, _ = list_runs(str(path), lang="en")
    assert i18n.t("bench.state_complete", "en") in text and i18n.t("bench.state_note", "en") not in text


@pytest.mark.parametrize("state", sorted(RUNS))
def test_the_report_view_says_the_state(state, stored):
    path, ids = stored
    page = html.unescape(show_run(path, ids[state], lang="en"))
    assert (f"Not a final result ({state})." in page) is (state not in ("complete", "older record"))
