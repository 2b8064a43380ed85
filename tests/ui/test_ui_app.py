"""The UI's handlers, called directly (no browser)."""

from __future__ import annotations

import warnings

import pytest

gr = pytest.importorskip("gradio")

from mixprec.ui import app as ui_app  # noqa: E402


@pytest.fixture
def tts_run(bf16_cpu):
    return ui_app.run_comparison("tts", "test", "fast", False, [], lang="en")


def test_run_tts_returns_audio_and_figures(tts_run):
    assert tts_run["kind"] == "audio"
    for key in ("fp32", "mixed"):
        rate, wave = tts_run[key]
        # Mono 16-bit PCM at its true level (Gradio would scale a float waveform to its own peak).
        assert rate == 24000 and wave.ndim == 1 and wave.size > 0 and wave.dtype.name == "int16"
        assert 0 < abs(wave.astype("int32")).max() < 32767
    assert f"Audio: {tts_run['fp32'][1].size / 24000:.2f} s at 24000 Hz" in tts_run["figures"]
    fp32_bytes, mixed_bytes = tts_run["weight_bytes"]
    assert mixed_bytes < fp32_bytes
    assert all(s > 0 for s in tts_run["latency_s"])
    assert tts_run["quality"]["snr_db"] > 20
    figures = tts_run["figures"]
    assert "fp32 reference" in figures and "fast" in figures and "SNR" in figures
    assert "untimed warm-up" in figures
    assert "Speed-up: **undecided (n=1)**" in figures  # one timing each: a sample, not a speed-up


def test_run_reuses_session_cache(tts_run):
    cache = tts_run["cache"]
    again = ui_app.run_comparison("tts", "test", "none", False, ["bf16"], lang="he", cache=cache)
    assert again["cache"][("tts", "test", "cpu")] is cache[("tts", "test", "cpu")]  # built on the default device, cpu
    assert "סוגים לפי רכיב" in again["figures"]
    assert "האצה: **לא הוכרע (" in again["figures"]


def test_benchmark_listing_of_missing_store(tmp_path):
    text, choices = ui_app.list_runs(str(tmp_path / "none.sqlite"), lang="ja")
    assert choices == [] and "none.sqlite" in text
    assert not (tmp_path / "none.sqlite").exists()
    assert "先に" in ui_app.show_run(None, None, lang="ja")


def test_build_app_in_every_language():
    for lang in ("en", "zh", "ja", "he"):
        assert isinstance(ui_app.build_app(lang), gr.Blocks)
    with pytest.raises(ValueError):
        ui_app.build_app("xx")


def test_run_bench_and_tune_forms_offer_the_devices_here(monkeypatch):
    import torch

    def device_menus(demo):
        return {b.elem_id: b for b in demo.blocks.values() if str(getattr(b, "elem_id", "")).endswith("-device")}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    menus = device_menus(ui_app.build_app("ja"))
    assert sorted(menus) == ["bench-device", "run-device", "tune-device"]
    assert all(m.label == "デバイス" and [v for _, v in m.choices] == ["cpu"] and m.value == "cpu" for m in menus.values())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    menus = device_menus(ui_app.build_app("he"))
    assert all([v for _, v in m.choices] == ["cpu", "cuda"] and m.label == "התקן" for m in menus.values())


def test_run_builds_the_pipeline_on_the_chosen_device():
    result = ui_app.run_comparison("minilm", "test", "none", False, [], lang="en", device="cpu")
    assert list(result["cache"]) == [("minilm", "test", "cpu")]
    assert result["cache"][("minilm", "test", "cpu")].device.type == "cpu"


def test_non_loopback_host_warns(monkeypatch):
    calls = []
    monkeypatch.setattr(gr.Blocks, "launch", lambda self, **kw: calls.append(kw))
    with pytest.warns(UserWarning, match="0.0.0.0"):
        ui_app.launch(host="0.0.0.0", port=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ui_app.launch(port=2)
    assert calls[-1]["server_name"] == "127.0.0.1"


def test_benchmark_listing_and_report(tmp_path):
    from mixprec.bench.store import Store

    path = tmp_path / "bench.sqlite"
    with Store(path) as store:
        run_id = store.start_run(pipeline="tts", size="test", machine={"cpu": "test"}, fingerprint="x",
                                 versions={"torch": "2"}, notes=[])
        for position, name in enumerate(("fp32", "fast")):
            config_id = store.add_config(run_id, position=position, name=name, batch=1)
            for index, seconds in enumerate((0.5, 0.4)):
                store.add_sample(config_id, index, seconds)
            store.finish_config(config_id, status="ok", metrics={"latency_s": 0.45, "sqnr_db": 40.0})
        store.finish_run(run_id)
    text, choices = ui_app.list_runs(str(path), lang="zh")
    assert [value for _, value in choices] == [run_id]
    assert "流水线" in text and "tts" in text
    frame = ui_app.show_run(str(path), run_id, lang="zh")
    assert frame.startswith('<iframe id="bench-report-frame" srcdoc="') and "fast" in frame


def test_diagnose_table_and_rules(tts_run):
    summary, table, toml_text, cache = ui_app.diagnose("tts", "test", "fast", lang="en", cache=tts_run["cache"])
    assert "modules are risky" in summary
    assert '<table id="diagnose-profile">' in table and "<th>Own SQNR (dB)</th>" in table
    assert isinstance(toml_text, str)
    assert ("tts", "test", "cpu") in cache


def test_run_latency_is_taken_after_a_warm_up():
    import time

    calls = []  # (entered, left) of each call

    def run():
        entered = time.perf_counter()
        if not calls:
            time.sleep(0.05)  # a first call paying lazy initialisation
        calls.append((entered, time.perf_counter()))
        return len(calls)

    out, seconds = ui_app._warm_then_time(run)
    end = time.perf_counter()
    (_, first_left), (second_entered, second_left) = calls
    # the timing spans the second call and nothing of the first, however long either took
    assert out == 2 and second_left - second_entered <= seconds <= end - first_left
