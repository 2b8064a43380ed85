"""End to end: the real app in headless Chromium, driven with Playwright."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from pathlib import Path

import pytest

gr = pytest.importorskip("gradio")

import mixprec  # noqa: E402
from mixprec.ui.app import build_app  # noqa: E402
from mixprec.ui.i18n import FSI, LANGUAGES, PDI, direction, t  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-quic", "--disable-sync"]
DOCS = Path(__file__).resolve().parents[2] / "docs"
WAIT_MS = 120_000
#: Read at import: the ``clean_env`` fixture removes MIXPREC_* variables before the test runs.
UPDATE_SCREENSHOTS = os.environ.get("MIXPREC_UPDATE_SCREENSHOTS") == "1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def sync_playwright():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright as start
    except ImportError:
        pytest.skip("the playwright package is not installed")
    return start


@contextlib.contextmanager
def _served(sync_playwright):
    """The English app on a free loopback port and a headless Chromium; both closed on exit."""
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    port = _free_port()
    demo = build_app("en")
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            try:
                yield browser, f"http://127.0.0.1:{port}/"
            finally:
                browser.close()
    finally:
        demo.close()
        expect.set_options(timeout=5_000)  # Playwright's default, for other tests


def _choose(page, elem_id: str, option: str) -> None:
    """Pick ``option`` (its shown text) in the Gradio dropdown ``elem_id``."""
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=option, exact=True).click()


#: The app's screens (tabs), and per screen a field whose label shows the screen is drawn in the chosen language.
SCREENS = {"run": ("run-pipeline", "run.pipeline_label"), "benchmark": ("bench-configs", "bench.configs_label"),
           "diagnose": ("diag-preset", "diag.preset_label"), "tune": ("tune-bound", "tune.bound_label")}
#: Fields whose label, help text and value must follow the page's direction, per screen.
FIELDS = {"run": ("run-pipeline", "run-device", "matmul-precision", "preset", "dtype-0", "upcast-attention"),
          "benchmark": ("bench-pipeline", "bench-configs", "bench-repeat", "bench-path"),
          "diagnose": ("diag-pipeline", "diag-preset"), "tune": ("tune-bound", "tune-budget", "tune-device")}
#: Checkbox rows: (element id, its first and second checkbox labels).
CHECKBOX_ROWS = {"run": ("upcast-attention", None, None), "benchmark": ("bench-configs", "fp32", "matmul-high")}

# Where each field's label, help text and value sit, and in which direction they are laid out.
_LAYOUT_JS = """(ids) => ids.map((id) => {
  const block = document.getElementById(id);
  const box = block.getBoundingClientRect();
  const text = (el) => {
    if (!el || !el.textContent.trim()) return null;
    const range = document.createRange();
    range.selectNodeContents(el);
    const rects = Array.from(range.getClientRects());
    const line = rects.filter((r) => Math.abs(r.top - rects[0].top) < 4);  // the first line, every bidi run of it
    const style = getComputedStyle(el);
    return {left: Math.min(...line.map((r) => r.left)) - box.left, right: box.right - Math.max(...line.map((r) => r.right)),
            direction: style.direction, align: style.textAlign};
  };
  const field = block.querySelector('input:not([type=checkbox]):not([type=radio]), textarea');
  const fieldStyle = field ? getComputedStyle(field) : null;
  return {id, label: text(block.querySelector('[data-testid="block-info"]')), info: text(block.querySelector('.info-text')),
          field: field ? {direction: fieldStyle.direction, align: fieldStyle.textAlign} : null};
})"""

# The x position of each checkbox and of its label text, in a checkbox row.
_CHECKBOXES_JS = """(id) => Array.from(document.getElementById(id).querySelectorAll('label')).filter((l) => l.querySelector('input[type=checkbox]')).map((l) => ({
  text: l.textContent.trim(), box: l.querySelector('input').getBoundingClientRect().left,
  label: l.getBoundingClientRect().left, text_x: l.querySelector('span').getBoundingClientRect().left}))"""


def _check_direction(page, screen: str, lang: str) -> None:
    """Every field of ``screen`` is laid out in ``lang``'s direction, judged by computed style and position."""
    rtl = lang == "he"
    for field in page.evaluate(_LAYOUT_JS, list(FIELDS[screen])):
        where = f"{lang} {screen} #{field['id']}"
        for part in ("label", "info"):
            text = field[part]
            if text is None:
                continue
            assert text["direction"] == ("rtl" if rtl else "ltr"), (where, part, text)
            assert text["align"] in ("start", "right" if rtl else "left"), (where, part, text)
            # The text starts at the reading side: against the right edge in Hebrew, the left one otherwise.
            near, far = (text["right"], text["left"]) if rtl else (text["left"], text["right"])
            assert near < 30 and near < far, (where, part, text)
        if field["field"] is not None:
            assert field["field"]["direction"] == ("rtl" if rtl else "ltr"), (where, field)
            assert field["field"]["align"] in ("start", "right" if rtl else "left"), (where, field)
    if screen in CHECKBOX_ROWS:
        row, first, second = CHECKBOX_ROWS[screen]
        boxes = page.evaluate(_CHECKBOXES_JS, row)
        assert boxes, (lang, row)
        for box in boxes:  # the box before its text in reading order: to its right in Hebrew
            assert (box["box"] > box["text_x"]) == rtl, (lang, row, box)
        if first is not None:
            x = {b["text"]: b["label"] for b in boxes}
            assert (x[first] > x[second]) == rtl, (lang, row, x)  # the row itself is mirrored


def _wav(page, elem_id: str) -> tuple[int, int, int, int]:
    """(channels, bytes per sample, sample rate, frames) of the audio a player serves."""
    import io
    import wave

    href = page.locator(f"#{elem_id} a[download]").first.get_attribute("href")
    body = page.request.get(href).body()
    with wave.open(io.BytesIO(body)) as w:
        return w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()


def test_browser_every_screen_in_every_language(sync_playwright, tmp_path, clean_env, bf16_cpu):
    """A preset's settings are shown, the players get the real audio, and each screen in each language
    is laid out in its direction: right-to-left in Hebrew, checked by computed style and position."""
    from playwright.sync_api import expect

    from mixprec import pipelines
    from mixprec.ui.controls import preset_matmul, preset_storage

    tts = pipelines.get("tts", size="test", seed=0)
    given = preset_storage("fast", tts.components, tuple(tts.sensitive))
    assert any(storage != "fp32" for storage, _ in given.values())  # bf16 measured fast: "fast" stores 16 bits
    before = mixprec.snapshot()
    try:
        with _served(sync_playwright) as (browser, url):
            page = browser.new_page(viewport={"width": 1280, "height": 1500})
            page.set_default_timeout(WAIT_MS)
            page.goto(url)
            expect(page.locator("#initialize")).to_be_visible()
            expect(page.locator("#dtype-0")).to_contain_text(t("controls.dtype_label", "en", component="ve"))  # tts loaded

            # The preset's own settings show: its matmul level and each component's weight type.
            _choose(page, "preset", "fast")
            expect(page.locator("#matmul-precision input")).to_have_value(preset_matmul("fast"))
            expect(page.locator("#matmul-precision")).to_contain_text('The preset "fast" sets')
            for i, name in enumerate(tts.components):
                expect(page.locator(f"#dtype-{i} input")).to_have_value(given[name][0])
                expect(page.locator(f"#dtype-{i} input")).to_be_disabled()
            _choose(page, "matmul-precision", "high")  # a choice of one's own overrides the preset, and says so
            page.locator("#initialize").click()
            status = page.locator("#init-status")
            expect(status).to_contain_text("Applied.")
            expect(status).to_contain_text("float32 matmul precision = high (from argument")
            expect(status).to_contain_text(f"overrides the {preset_matmul('fast')} of the preset")
            assert mixprec.describe()["float32_matmul_precision"] == "high"

            page.locator("#run-button").click()
            figures = page.locator("#run-figures")
            expect(figures).to_contain_text("fp32 reference")
            expect(figures).to_contain_text("SNR")
            text = figures.inner_text()
            assert "fast" in text and "Speed-up" in text
            # The players get mono 16-bit audio at the pipeline's rate and length, and say how long it is.
            out = tts.run(tts.example_inputs(batch=1, seed=0))
            frames = out.output[0].shape[-1]
            seconds = f"{frames / out.sample_rate:.2f} s"
            for player in ("run-fp32-audio", "run-mixed-audio"):
                expect(page.locator(f"#{player}")).to_be_visible()
                expect(page.locator(f"#{player}")).to_contain_text(seconds)
                assert _wav(page, player) == (1, 2, out.sample_rate, frames)
            expect(figures).to_contain_text(f"Audio: {frames / out.sample_rate:.2f} s at {out.sample_rate} Hz")

            if UPDATE_SCREENSHOTS:
                page.wait_for_timeout(2_000)  # the players draw their waveforms after they become visible
                page.screenshot(path=str(DOCS / "ui-run.png"), full_page=True)

            for lang in ("en", "zh", "ja", "he"):
                if lang != "en":
                    _choose(page, "language", LANGUAGES[lang])
                want = direction(lang)
                expect(page.locator("html")).to_have_attribute("dir", want)
                expect(page.locator("#mixprec-header")).to_have_attribute("dir", want)
                expect(page.locator("#run-button")).to_have_text(t("run.button", lang))
                expect(status).to_contain_text("float32 matmul precision = high (from argument")
                for screen, (elem_id, key) in SCREENS.items():
                    page.get_by_role("tab", name=t(f"tab.{screen}", lang)).click()
                    expect(page.locator(f"#{elem_id}")).to_contain_text(t(key, lang))
                    expect(page.locator(f"#{elem_id}")).to_be_visible()
                    _check_direction(page, screen, lang)
                    if screen == "benchmark":
                        expect(page.locator("#bench-cancel")).to_be_disabled()  # nothing runs
                    page.screenshot(path=str(tmp_path / f"ui-{screen}-{lang}.png"), full_page=True)
                page.get_by_role("tab", name=t("tab.run", lang)).click()
            # Latin words inside the Hebrew texts are isolated, so their punctuation stays with them.
            info = page.locator("#upcast-attention").inner_text()
            assert f"({FSI}attention{PDI})" in info and f"{FSI}fp32{PDI}" in info
            assert all((tmp_path / f"ui-{screen}-{lang}.png").stat().st_size > 10_000
                       for screen in SCREENS for lang in LANGUAGES)
    finally:
        mixprec.restore(before)


def _fill(page, elem_id: str, text: str) -> None:
    """Type into a Gradio field, leave it, and check that the value stays.

    A tab's fields are mounted when the tab is first shown and then receive their initial
    values from the app; on a loaded machine that can land after the text was typed and
    overwrite it, so the click that follows would send the default. Typing again until the
    value holds makes the next click send what the test typed.
    """
    from playwright.sync_api import expect

    box = page.locator(f"#{elem_id} input, #{elem_id} textarea").first
    for _ in range(10):
        box.fill(text)
        box.press("Tab")
        page.wait_for_timeout(300)
        if box.input_value() == text:
            return
    expect(box).to_have_value(text)


def test_browser_benchmark_cancel_and_tune(sync_playwright, tmp_path, clean_env):
    """Live progress, Cancel, a second session that is left alone, and a search whose plot grows."""
    from playwright.sync_api import expect

    from mixprec.bench.store import Store

    db = str(tmp_path / "bench.sqlite")
    with _served(sync_playwright) as (browser, url):
        page, other = (browser.new_context().new_page() for _ in range(2))
        for p in (page, other):
            p.set_default_timeout(WAIT_MS)
            p.goto(url)
            p.get_by_role("tab", name=t("tab.benchmark", "en")).click()

        status = page.locator("#bench-status")
        for name in ("fp32", "fast"):
            page.locator("#bench-configs").get_by_label(name, exact=True).uncheck()
        page.locator("#bench-run-button").click()
        expect(status).to_contain_text(t("bench.error_configs", "en").replace("**", ""))
        page.locator("#bench-configs").get_by_label("fast", exact=True).check()
        _fill(page, "bench-repeat", "500")
        _fill(page, "bench-warmup", "0")
        _fill(page, "bench-path", db)
        page.locator("#bench-run-button").click()
        expect(status.locator("progress")).to_be_visible()
        expect(status).to_contain_text(": run ")  # measuring

        expect(other.locator("#bench-cancel")).to_be_disabled()  # the other session has nothing to cancel
        expect(page.locator("#bench-cancel")).to_be_enabled()

        page.locator("#bench-cancel").click()
        expect(status).to_contain_text("Cancelled.")
        expect(page.locator("#bench-cancel")).to_be_disabled()  # nothing runs any more
        expect(page.locator("#bench-plot img")).to_be_visible()
        table = page.locator("#bench-table")
        expect(table).to_contain_text("fast")
        expect(page.locator("#bench-runs")).to_contain_text("cancelled")
        # Whole words in the table: no header or cell breaks inside a word (each stays one line high).
        cells = page.evaluate("""() => Array.from(document.querySelectorAll('#bench-table th, #bench-table td')).map((c) => ({
            text: c.innerText, height: c.getBoundingClientRect().height, line: parseFloat(getComputedStyle(c).lineHeight) || 24,
            wrap: getComputedStyle(c).whiteSpace}))""")
        assert cells and all(c["wrap"] == "nowrap" for c in cells)
        assert all(c["height"] < 2 * c["line"] + 20 for c in cells), cells
        # Each verdict word in a speed-up cell is explained under the table.
        text = table.inner_text()
        for word in ("undecided", "unstable"):
            if f"{word} (" in text:
                assert t(f"bench.note_{word}", "en").replace("**", "") in text
        with Store(db) as store:
            run = store.load_run(store.runs()[0]["id"])
        assert run["status"] == "cancelled" and run["configs"][0]["samples"]

        page.get_by_role("tab", name=t("tab.tune", "en")).click()
        tune_status = page.locator("#tune-status")
        expect(page.locator("#tune-bound textarea")).to_have_value("cosine>=0.999")  # the tab is shown and synced
        _fill(page, "tune-bound", "snr=>30")
        page.locator("#tune-start").click()
        expect(tune_status).to_contain_text("The quality bound is not valid")
        expect(tune_status).to_contain_text("'<metric> <op> <number>'")
        _fill(page, "tune-bound", "cosine>=0.999")
        _fill(page, "tune-budget", "16")
        _fill(page, "tune-path", db)
        page.locator("#tune-start").click()
        expect(page.locator("#tune-plot img")).to_be_visible()
        expect(page.locator("#tune-summary")).to_contain_text("Bound cosine>=0.999 met.")
        expect(page.locator("#tune-policy")).to_contain_text('name = "tuned"')
        expect(tune_status).to_contain_text("Finished")
        expect(page.locator("#tune-cancel")).to_be_disabled()
        # The policy box numbers every line it shows and wraps long ones instead of cutting them.
        shown = page.locator("#tune-policy .cm-line").count()
        numbers = [int(n) for n in page.locator("#tune-policy .cm-lineNumbers .cm-gutterElement").all_inner_texts()
                   if n.strip().isdigit()]
        assert shown and numbers[:shown] == list(range(1, shown + 1)), (shown, numbers)
        assert "cm-lineWrapping" in (page.locator("#tune-policy .cm-content").get_attribute("class") or "")
        page.screenshot(path=str(tmp_path / "ui-tune-en.png"), full_page=True)
        if UPDATE_SCREENSHOTS:
            shutil.copyfile(tmp_path / "ui-tune-en.png", DOCS / "ui-tune.png")
