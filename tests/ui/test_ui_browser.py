"""End to end: the real app in headless Chromium, driven with Playwright."""

from __future__ import annotations

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
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "ui-run.png"
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


def _choose(page, elem_id: str, option: str) -> None:
    """Pick ``option`` (its shown text) in the Gradio dropdown ``elem_id``."""
    page.locator(f"#{elem_id} input").click()
    page.get_by_role("option", name=option, exact=True).click()


def test_browser_run_and_languages(sync_playwright, tmp_path, clean_env):
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    before = mixprec.snapshot()
    port = _free_port()
    demo = build_app("en")
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 1500})
                page.set_default_timeout(WAIT_MS)
                page.goto(f"http://127.0.0.1:{port}/")
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

                shot = tmp_path / "ui-run-en.png"
                page.screenshot(path=str(shot), full_page=True)
                if UPDATE_SCREENSHOTS:
                    DOCS_SCREENSHOT.parent.mkdir(exist_ok=True)
                    shutil.copyfile(shot, DOCS_SCREENSHOT)

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
                browser.close()
    finally:
        demo.close()
        mixprec.restore(before)
        expect.set_options(timeout=5_000)  # Playwright's default, for other tests
