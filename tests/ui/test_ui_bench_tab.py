"""The Benchmark tab's handlers, called directly: real workers, real pipelines (test size), a real store."""

from __future__ import annotations

import pytest

gr = pytest.importorskip("gradio")

from mixprec.bench.store import Store  # noqa: E402
from mixprec.ui.bench_tab import bench_cancel, bench_run, list_runs, results_table  # noqa: E402
from mixprec.ui.i18n import t  # noqa: E402
from mixprec.ui.jobs import Job  # noqa: E402

UNCHANGED = {"__type__": "update"}


def test_run_streams_progress_then_results_and_other_sessions_are_untouched(tmp_path):
    db = tmp_path / "bench.sqlite"
    mine, other = Job(), Job()
    outputs, other_said = [], []
    for out in bench_run("en", "minilm", "test", ["fast"], 2, 0, "cpu", str(db), mine):
        outputs.append(out)
        if mine.running and not other_said:
            other_said.append(bench_cancel("en", other))  # another session's Cancel, while this one runs
    assert other_said and all(t("job.idle", "en") in said for said in other_said)
    assert not mine.should_stop() and not other.should_stop()

    progress = [out[0] for out in outputs[1:-1]]
    assert progress and all("<progress" in status for status in progress)
    assert all(out[3] == UNCHANGED for out in outputs[:-1])  # the runs list changes only at the end
    assert "Step 5 of 5" in progress[-1]  # fp32 added first: reference + 2 timed runs each

    status, table, plot, runs, pick = outputs[-1]
    assert "<strong>Finished.</strong>" in status
    assert table.startswith("| Configuration | Status | Latency (median) |") and "| fast | ok |" in table
    assert plot.startswith('<img id="bench-plot-img"') and "data:image/png;base64," in plot
    run_id = pick["value"]
    assert "| complete | minilm | test | 2 |" in runs and [value for _, value in pick["choices"]] == [run_id]
    with Store(db) as store:
        run = store.load_run(run_id)
    assert run["status"] == "complete" and "--configs fp32,fast" in run["command"]
    assert [(c["name"], c["status"], len(c["samples"])) for c in run["configs"]] == [("fp32", "ok", 2), ("fast", "ok", 2)]
    assert "| 正常 |" in results_table(run, "zh") and "| 延迟（中位数） |" in results_table(run, "zh")


def test_cancel_keeps_what_was_measured(tmp_path):
    db = tmp_path / "bench.sqlite"
    job = Job()
    said, outputs = None, []
    for out in bench_run("he", "minilm", "test", ["fp32", "fast"], 500, 0, "cpu", str(db), job):
        outputs.append(out)
        if said is None and ": run " in out[0]:  # the first timed run was measured
            said = bench_cancel("he", job)
    assert said is not None and t("job.cancelling", "he") in said
    assert t("job.idle", "he") in bench_cancel("he", job)  # the run is over

    status, table, _plot, _runs, pick = outputs[-1]
    assert "בוטל" in status and f"#{pick['value']}" in status
    with Store(db) as store:
        run = store.load_run(pick["value"])
    assert run["status"] == "cancelled"
    counts = {c["name"]: len(c["samples"]) for c in run["configs"]}
    assert 1 <= sum(counts.values()) < 100 and counts["fp32"] >= 1
    fp32 = run["configs"][0]
    assert fp32["metrics"]["latency_median"] > 0 and fp32["metrics"]["weight_bytes"] > 0  # measured, then kept
    assert "fp32" in table and "fast" in table
    text, choices = list_runs(str(db), lang="en")
    assert "cancelled" in text and choices[0][1] == run["id"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((["fast"], 3, 1), "**Not started.** Timed runs must be a whole number from 1 to 1000"),
        (([], 3, 1), "Choose at least one configuration"),
        ((None, 3, 1), "Choose at least one configuration"),
        ((["fast", "turbo"], 3, 1), '"turbo" is not a valid value for Configurations; choose one of: fp32, matmul-high'),
        ((["fast"], 0, 1), 'got "0"'),
        ((["fast"], 1.5, 1), 'got "1.5"'),
        ((["fast"], "abc", 1), 'got "abc"'),
        ((["fast"], None, 1), 'got ""'),
        ((["fast"], 3, -1), "Warm-up runs must be a whole number from 0 to 1000"),
    ],
)
def test_invalid_input_shows_a_message_and_starts_nothing(tmp_path, args, expected):
    configs, repeat, warmup = args
    if expected.startswith("**Not started.** Timed"):
        repeat = 1001
    db = tmp_path / "bench.sqlite"
    job = Job()
    outputs = list(bench_run("en", "minilm", "test", configs, repeat, warmup, "cpu", str(db), job))
    assert len(outputs) == 1
    status, *rest = outputs[0]
    assert expected.replace("**Not started.**", "<strong>Not started.</strong>") in status.replace("&quot;", '"')
    assert rest == [UNCHANGED] * 4
    assert not db.exists() and not job.running


@pytest.mark.parametrize("bad", [False, True])
def test_a_request_naming_50000_configurations_is_answered_in_a_few_lines(tmp_path, monkeypatch, bad):
    """A request of the API listing 50,000 configurations (every name the tab offers, over and over, or one bad
    name among them): each configuration is measured once, and every answer stays short."""
    from mixprec.bench import runner
    from mixprec.ui.bench_tab import CONFIGS
    from run_states import write_run

    started = []

    def fake_run(options, hw, store, **_):  # what a run of these options stores, without measuring
        started.append(options)
        return write_run(store, "partly measured")

    monkeypatch.setattr(runner, "run_bench", fake_run)
    configs = [CONFIGS[i % len(CONFIGS)] for i in range(50_000)]
    if bad:
        configs[-1] = "turbo" * 1000
    outputs = list(bench_run("en", "minilm", "test", configs, 3, 1, "cpu", str(tmp_path / "b.sqlite"), Job()))
    assert all(len(out[0]) < 1000 for out in outputs), [len(out[0]) for out in outputs]  # each status line
    assert all(len(out[1]) < 4000 for out in outputs if isinstance(out[1], str))  # the table: one row per configuration
    if bad:
        assert len(outputs) == 1 and not started
    else:
        (options,) = started
        assert [s.name for s in options.configs] == list(CONFIGS) and len(options.command) < 1000


def test_invalid_choices_are_named_in_the_session_language(tmp_path):
    db = str(tmp_path / "bench.sqlite")
    [[status, *_]] = bench_run("ja", "ttx", "test", ["fast"], 3, 1, "cpu", db, Job())
    assert "ttx" in status and "パイプライン" in status and "tts" in status
    [[status, *_]] = bench_run("zh", "minilm", "huge", ["fast"], 3, 1, "cpu", db, Job())
    assert "huge" in status and "test, default" in status and "未启动" in status
    [[status, *_]] = bench_run("en", "minilm", "test", ["fast"], 3, 1, "tpu", db, Job())
    assert '"tpu" is not a valid value for Device' in status.replace("&quot;", '"')


def test_a_file_that_is_not_a_database_is_reported_and_left_alone(tmp_path):
    text_file = tmp_path / "notes.sqlite"
    text_file.write_text("hello")
    job = Job()
    outputs = list(bench_run("en", "minilm", "test", ["fast"], 1, 0, "cpu", str(text_file), job))
    status = outputs[-1][0]
    assert "<strong>The benchmark failed:</strong> StoreError" in status and "not a SQLite database" in status
    assert text_file.read_text() == "hello" and not job.running


def _cfg(name, samples, **metrics):
    rounds = list(range(len(samples)))
    return {"name": name, "batch": 1, "status": "ok", "error": None, "samples": samples, "rounds": rounds,
            "metrics": {"latency_median": sorted(samples)[len(samples) // 2], **metrics}}


class TestSpeedupCellsAreExplained:
    """A speed-up cell's verdict is in the table's language, marked, and explained under the table."""

    RUNS = {
        # fast timed at about fp32's speed: the interval holds 1
        "undecided": [_cfg("fp32", [1.0, 1.1, 0.9, 1.0, 1.05]), _cfg("fast", [1.0, 1.0, 1.0, 1.1, 0.95])],
        "faster": [_cfg("fp32", [1.0, 1.1, 0.9, 1.0, 1.05]), _cfg("fast", [0.5, 0.55, 0.45, 0.5, 0.52])],
        "one pair": [_cfg("fp32", [1.0]), _cfg("fast", [0.5])],
    }

    @pytest.mark.parametrize("case", list(RUNS))
    @pytest.mark.parametrize("lang", ["en", "zh", "ja", "he"])
    def test_notes(self, case, lang):
        from mixprec.bench.table import render_table_rows

        run = {"id": 1, "pipeline": "tts", "size": "test", "status": "complete", "configs": self.RUNS[case], "notes": []}
        cells = [r["speedup"] for r in render_table_rows(run)]
        text = results_table(run, lang)
        undecided = any(c.startswith("undecided") for c in cells)
        assert undecided == (case != "faster")
        assert (t("bench.note_undecided", lang) in text) == undecided
        assert (t("bench.cell_undecided", lang) in text) == undecided
        assert t("bench.note_paired", lang) in text
        assert t("bench.cell_reference", lang) in text
        if lang != "en":
            assert "undecided" not in text.split("\n\n")[0] and "reference" not in text.split("\n\n")[0]


class TestSpeedOutsideTables:
    """The Run tab (one timing each) and the Tune tab's summary say a speed-up as the tables do:
    a figure only where paired rounds give an interval wholly on one side of 1."""

    @staticmethod
    def _result(final, chosen=1):
        import mixprec
        from mixprec.tuning.bounds import parse_bound
        from mixprec.tuning.candidates import Candidate, Evaluation
        from mixprec.tuning.result import TuneResult

        path = [Candidate(i, "baseline" if i == 0 else f"step {i}", mixprec.Policy(),
                          Evaluation(latency_s=1.0 / (1 + i), memory_bytes=1e6, quality={"cosine": 1.0}), True, 0.0)
                for i in range(2)]
        return TuneResult(policy=mixprec.Policy(name="tuned"), bound=parse_bound("cosine>=0.99"), objective="latency",
                          met=True, chosen=path[chosen], closest=None, miss=None, frontier=path, evaluations=2, cached=0,
                          wall_s=1.0, path=path, final=final)

    @pytest.mark.parametrize(("final", "chosen", "word", "rest"), [
        ({0: [1.0, 1.1, 0.9, 1.0, 1.05], 1: [0.5, 0.55, 0.45, 0.5, 0.52]}, 1, None, "2.00x (2.00–2.02)"),
        ({0: [1.0, 1.1, 0.9, 1.0, 1.05], 1: [1.0, 1.0, 1.0, 1.1, 0.95]}, 1, "undecided", " (0.90–1.11)"),
        ({0: [1.0, 1.0], 1: [0.5, 0.5]}, 1, "undecided", " (n=2)"),
        ({}, 1, "undecided", " (no interval)"),  # search medians only (2.00x), taken at different moments
        ({0: [1.0, 1.0, 1.0]}, 0, "reference", ""),
    ])
    @pytest.mark.parametrize("lang", ["en", "zh", "ja", "he"])
    def test_tune_summary(self, final, chosen, word, rest, lang):
        from mixprec.ui.i18n import bidi
        from mixprec.ui.tune_tab import _speed, _summary

        result = self._result(final, chosen)
        said = _speed(result, lang)
        assert said == (t(f"bench.cell_{word}", lang) if word else "") + rest
        head = _summary(result, False, lang).split("\n")[0]
        assert bidi(said, lang) in head or said in head
        if word is not None:  # no figure reads as a speed-up: not the medians' 2.00, not the interval's
            assert "2.00x" not in head and "×" not in head

    @pytest.mark.parametrize("lang", ["en", "zh", "ja", "he"])
    def test_run_tab_reads_one_timing_each_as_undecided(self, lang):
        from mixprec.ui.bench_tab import speedup_text

        said = speedup_text(2.5, 2.5, 2.5, 1, lang)
        assert t("bench.cell_undecided", lang).strip("\u2068\u2069") in said and "n=1" in said and "2.5" not in said


@pytest.mark.parametrize("lang", ["en", "zh", "ja", "he"])
def test_a_calibrated_preset_says_what_its_calibration_kept(lang):
    from mixprec.ui.bench_tab import CONFIGS

    assert {"balanced+calibrated", "fast+calibrated", "memory+calibrated"} <= set(CONFIGS)
    kept = "fast, calibrated: naive-bf16 1.49x fp32 (1.43-1.52), measured in cpu-time over 30 paired rounds (9.5 s)"
    configs = [_cfg("fp32", [1.0, 1.1, 0.9, 1.0, 1.05]), dict(_cfg("fast+calibrated", [0.5, 0.55, 0.45, 0.5, 0.52]),
                                                              policy={"name": kept, "rules": []})]
    run = {"id": 1, "pipeline": "minilm", "size": "test", "status": "complete", "configs": configs, "notes": []}
    text = results_table(run, lang)
    assert t("bench.note_calibrated", lang) in text and f"fast+calibrated: {kept}" in text
    plain = {**run, "configs": [configs[0], dict(_cfg("fast", [0.5] * 5), policy={"name": "fast", "rules": []})]}
    assert t("bench.note_calibrated", lang) not in results_table(plain, lang)


def test_a_preset_calibrated_per_component_lists_its_components_under_it():
    kept = ("fast, calibrated: per component (t3 naive-bf16, vocoder rules) 2.26x fp32 predicted from the components; "
            "t3: 39% of the run, naive-bf16, 2.49x fp32, own SQNR 38.8 dB; "
            "vocoder: 22% of the run, rules, 1.41x fp32 (predicted), own SQNR 39.2 dB")
    configs = [_cfg("fp32", [1.0, 1.1, 0.9, 1.0, 1.05]), dict(_cfg("fast+calibrated", [0.5, 0.55, 0.45, 0.5, 0.52]),
                                                              policy={"name": kept, "rules": []})]
    text = results_table({"id": 1, "pipeline": "tts", "size": "test", "status": "complete", "configs": configs,
                          "notes": []}, "en")
    assert "- fast+calibrated: fast, calibrated: per component (t3 naive-bf16, vocoder rules)" in text
    assert "\n    - t3: 39% of the run, naive-bf16, 2.49x fp32, own SQNR 38.8 dB" in text
    assert "\n    - vocoder: 22% of the run, rules, 1.41x fp32 (predicted), own SQNR 39.2 dB" in text
