"""The UI's store boxes stay inside the server's folder, long paths are clipped, the controls say what they applied,
the Hebrew page is Hebrew, a busy port names --port, and the examples name the Hub CLI that is installed."""

from __future__ import annotations

import html
import os
import socket
from importlib import metadata
from pathlib import Path

import pytest

gr = pytest.importorskip("gradio")

from typer.testing import CliRunner  # noqa: E402

from mixprec.cli import app as cli_app  # noqa: E402
from mixprec.ui import app as ui_app  # noqa: E402
from mixprec.ui.bench_tab import bench_run, list_runs, show_run  # noqa: E402
from mixprec.ui.controls import (NO_PRESET, dtype_selector_update, initialize_service,  # noqa: E402
                                 precision_controls)
from mixprec.ui.i18n import LANGUAGES, t  # noqa: E402
from mixprec.ui.jobs import Job  # noqa: E402
from mixprec.ui.stores import StoreLocationError, resolve_store, store_root, stores_confined_to  # noqa: E402
from mixprec.ui.tune_tab import tune_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def served(tmp_path):
    """Stores confined as while ``mixprec ui`` serves, to ``tmp_path / "stores"``."""
    with stores_confined_to(tmp_path / "stores") as root:
        yield root
    assert store_root() is None


def test_stores_inside_the_folder_are_allowed(served):
    assert resolve_store("runs.sqlite", served / "bench.sqlite") == str(served / "runs.sqlite")
    assert resolve_store(str(served / "a.sqlite"), served / "bench.sqlite") == str(served / "a.sqlite")
    assert resolve_store("", served / "bench.sqlite") == str(served / "bench.sqlite")
    # the default store outside the folder given: the empty box means bench.sqlite in the folder
    assert resolve_store("", Path("/elsewhere/bench.sqlite")) == str(served / "bench.sqlite")


@pytest.mark.parametrize("typed", ["/tmp/evil.sqlite", "../escape.sqlite", "sub/../../escape.sqlite", "/etc/passwd", "."])
def test_stores_outside_the_folder_are_refused(served, typed):
    with pytest.raises(StoreLocationError, match="outside this server's store folder|is a folder"):
        resolve_store(typed, served / "bench.sqlite")


def test_a_symbolic_link_out_of_the_folder_is_refused(served, tmp_path):
    (served / "link.sqlite").symlink_to(tmp_path / "outside.sqlite")
    with pytest.raises(StoreLocationError, match="outside"):
        resolve_store("link.sqlite", served / "bench.sqlite")


def test_absurd_paths_are_refused_with_a_short_message(served):
    for typed in ("x" * 100_000, "a\x00b.sqlite"):
        with pytest.raises(StoreLocationError) as info:
            resolve_store(typed, served / "bench.sqlite")
        assert len(str(info.value)) < 400
    assert "(100,000 characters)" in str(pytest.raises(StoreLocationError, resolve_store, "x" * 100_000, served).value)


def test_without_the_server_any_path_is_opened(tmp_path):
    assert store_root() is None
    assert resolve_store(str(tmp_path / "b.sqlite"), tmp_path / "d.sqlite") == str(tmp_path / "b.sqlite")


def test_tabs_create_nothing_outside_the_folder(served, tmp_path):
    outside = tmp_path / "outside.sqlite"
    text, choices = list_runs(str(outside), lang="en")
    assert choices == [] and "outside this server's store folder" in text
    assert "outside this server's store folder" in html.unescape(show_run(str(outside), 1, lang="en"))
    [[status, *_]] = list(bench_run("en", "minilm", "test", ["fast"], 1, 0, "cpu", str(outside), Job()))
    assert "outside this server's store folder" in html.unescape(status)
    [[status, *_]] = list(tune_run("en", "minilm", "test", "cosine>=0.99", "latency", 16, str(outside), Job()))
    assert "outside this server's store folder" in html.unescape(status)
    assert not outside.exists() and list(served.iterdir()) == []


def test_a_huge_path_is_not_echoed(served):
    text, _ = list_runs("y" * 100_000, lang="he")
    assert len(text) < 1_000 and "(100,000 characters)" in text
    [[status, *_]] = list(bench_run("en", "minilm", "test", ["fast"], 1, 0, "cpu", "z" * 100_000, Job()))
    assert len(status) < 1_000


def test_initialize_with_a_preset_says_the_preset(clean_env, restore_flags):
    status = initialize_service(None, matmul="high", preset="memory", lang="en")
    assert "precision preset = not set" not in status
    assert "preset **memory**" in status
    status = initialize_service(None, matmul="high", preset=NO_PRESET, upcast_attention=True,
                                dtypes={"encoder": "bf16", "decoder": "fp32"}, lang="ja")
    assert "重み encoder bf16, decoder fp32" in status and "アテンションは fp32 で計算" in status


def test_a_preset_locks_the_component_selectors():
    locked = dtype_selector_update("fast", "he")
    assert locked["interactive"] is False and "fast" in locked["info"] and t("controls.preset_none", "he") in locked["info"]
    free = dtype_selector_update(NO_PRESET, "en")
    assert free["interactive"] is True and free["info"] == t("controls.dtype_info", "en")


def _handler(demo, name):
    return next(f.fn for f in demo.fns.values() if getattr(f.fn, "__name__", "") == name)


def test_the_embeddable_controls_lock_their_selectors_on_a_preset():
    from mixprec import pipelines

    with gr.Blocks() as demo:
        controls = precision_controls(pipeline=pipelines.get("tts", size="test"), lang="en")
    lock = _handler(demo, "lock")
    updates = lock("balanced")
    assert len(updates) == len(controls.dtypes) and all(u["interactive"] is False for u in updates)
    assert all(u["interactive"] is True for u in lock(NO_PRESET))


def test_switching_to_hebrew_translates_the_empty_figures_and_keeps_selectors_locked():
    demo = ui_app.build_app("en")
    on_language = _handler(demo, "on_language")
    status = ui_app.defaults_message(None, "en")
    slots = ["fp32"] * ui_app.MAX_COMPONENTS
    out = on_language("he", "tts", "test", {}, status, t("run.figures_empty", "en"), "fast", *slots)
    assert out[2] == t("run.figures_empty", "he") != t("run.figures_empty", "en")
    *_, state = out
    shown = [u for u in out[-1 - ui_app.MAX_COMPONENTS:-1] if u.get("visible")]
    assert shown and all(u["interactive"] is False for u in shown)
    kept = on_language("ja", "tts", "test", state, status, "| a | figures |", NO_PRESET, *slots)
    assert kept[2] == gr.update()  # figures of a run are not replaced


@pytest.fixture
def busy_port():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    yield holder.getsockname()[1]
    holder.close()


def test_a_busy_port_names_the_port_flag(busy_port, tmp_path, clean_env):
    result = CliRunner().invoke(cli_app, ["ui", "--port", str(busy_port), "--store-dir", str(tmp_path / "s")])
    assert result.exit_code == 2, result.output
    assert f"--port {busy_port}: port {busy_port} on 127.0.0.1 is in use by another program; choose another with --port" \
        in result.output
    assert "server_port" not in result.output and "GRADIO_SERVER_PORT" not in result.output
    assert store_root() is None  # the confinement ended with the failed launch


def test_store_dir_must_be_a_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    result = CliRunner().invoke(cli_app, ["ui", "--store-dir", str(tmp_path / "file")])
    assert result.exit_code == 2 and "--store-dir" in result.output and "not a folder" in result.output


def test_the_examples_name_the_installed_hub_cli():
    text = (ROOT / "examples" / "README.md").read_text(encoding="utf-8")
    assert "huggingface-cli" not in text and "hf download ResembleAI/chatterbox" in text
    scripts = {ep.name for ep in metadata.distribution("huggingface_hub").entry_points if ep.group == "console_scripts"}
    assert "hf" in scripts


def test_every_language_has_the_new_texts():
    for key in ("controls.dtype_info_preset", "controls.status_policy_preset", "controls.status_policy_types",
                "controls.status_upcast"):
        texts = {t(key, code, preset="p", none="n", types="x", upcast="", kept="") for code in LANGUAGES}
        assert len(texts) == len(LANGUAGES)  # each language its own text
    assert os.path.exists(ROOT / "src" / "mixprec" / "ui" / "stores.py")
