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
from mixprec.ui.i18n import LANGUAGES, t  # noqa: E402

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


def test_browser_run_and_languages(sync_playwright, tmp_path, clean_env, bf16_cpu):
    from playwright.sync_api import expect

    before = mixprec.snapshot()
    try:
        with _served(sync_playwright) as (browser, url):
            page = browser.new_page(viewport={"width": 1280, "height": 1500})
            page.set_default_timeout(WAIT_MS)
            page.goto(url)
            expect(page.locator("#initialize")).to_be_visible()

            _choose(page, "matmul-precision", "high")
            page.locator("#initialize").click()
            status = page.locator("#init-status")
            expect(status).to_contain_text("Applied.")
            expect(status).to_contain_text("float32 matmul precision = high (from argument")
            assert mixprec.describe()["float32_matmul_precision"] == "high"

            expect(page.locator("#dtype-0")).to_contain_text(t("controls.dtype_label", "en", component="ve"))  # tts components loaded
            _choose(page, "preset", "fast")
            page.locator("#run-button").click()
            figures = page.locator("#run-figures")
            expect(figures).to_contain_text("fp32 reference")
            expect(figures).to_contain_text("SNR")
            text = figures.inner_text()
            assert "fast" in text and "Speed-up" in text
            expect(page.locator("#run-mixed-audio")).to_be_visible()
            expect(page.locator("#run-fp32-audio")).to_be_visible()

            if UPDATE_SCREENSHOTS:
                page.wait_for_timeout(2_000)  # the players draw their waveforms after they become visible
            shot = tmp_path / "ui-run-en.png"
            page.screenshot(path=str(shot), full_page=True)
            if UPDATE_SCREENSHOTS:
                shutil.copyfile(shot, DOCS / "ui-run.png")

            for lang in ("zh", "ja", "he"):
                _choose(page, "language", LANGUAGES[lang])
                expect(page.locator("#run-button")).to_have_text(t("run.button", lang))
                expect(page.get_by_role("tab", name=t("tab.diagnose", lang))).to_be_visible()
                want = "rtl" if lang == "he" else "ltr"
                expect(page.locator("#tab-run")).to_contain_text(t("controls.heading", lang).lstrip("# "))
                expect(status).to_contain_text("float32 matmul precision = high (from argument")
                expect(page.locator("html")).to_have_attribute("dir", want)
                expect(page.locator("#mixprec-header")).to_have_attribute("dir", want)
                page.screenshot(path=str(tmp_path / f"ui-run-{lang}.png"), full_page=True)
            assert page.locator('[dir="rtl"]').count() >= 2
            assert all((tmp_path / f"ui-run-{lang}.png").stat().st_size > 10_000 for lang in LANGUAGES)
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
            page.locator("#bench-configs").get_by_label(name).uncheck()
        page.locator("#bench-run-button").click()
        expect(status).to_contain_text(t("bench.error_configs", "en").replace("**", ""))
        page.locator("#bench-configs").get_by_label("fast").check()
        _fill(page, "bench-repeat", "500")
        _fill(page, "bench-warmup", "0")
        _fill(page, "bench-path", db)
        page.locator("#bench-run-button").click()
        expect(status.locator("progress")).to_be_visible()
        expect(status).to_contain_text(": run ")  # measuring

        other.locator("#bench-cancel").click()  # the other session has nothing to cancel
        expect(other.locator("#bench-status")).to_contain_text(t("job.idle", "en"))

        page.locator("#bench-cancel").click()
        expect(status).to_contain_text("Cancelled.")
        expect(page.locator("#bench-plot img")).to_be_visible()
        expect(page.locator("#bench-table")).to_contain_text("fast")
        expect(page.locator("#bench-runs")).to_contain_text("cancelled")
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
        page.screenshot(path=str(tmp_path / "ui-tune-en.png"), full_page=True)
        if UPDATE_SCREENSHOTS:
            shutil.copyfile(tmp_path / "ui-tune-en.png", DOCS / "ui-tune.png")
