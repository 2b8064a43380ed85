"""Which configuration a run says to use, and how sure: :mod:`mixprec.bench.headline` on runs written into a
real store, and where it is said (the end of ``mixprec bench``, ``--json``, the HTML report)."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mixprec.bench import evidence, export, report
from mixprec.bench.headline import DECIDED, INDICATIVE, KEEP, NOTHING, by_machine, floor_db, headline_lines, headlines
from mixprec.bench.store import Store
from mixprec.cli import app
from run_states import store_of_states, write_run
from stored_runs import jitter, machine_load, store_run

#: A pipeline whose workers load in no time beyond torch's import (tests/small_factory.py):
#: the end of a real ``bench`` command, whatever the model.
SMALL = f"{Path(__file__).parents[1] / 'small_factory.py'}:build"

ROUNDS = 8
REF = {"snr_db": float("inf"), "nonfinite": 0, "weight_bytes": 4 * 2**20}


def _q(snr: float, weights: float = 2 * 2**20, **more) -> dict:
    return {"snr_db": snr, "nonfinite": 0, "weight_bytes": weights, **more}


def _timed(ratio: float, rounds: int = ROUNDS, *, seed: int = 3) -> list[float]:
    """Seconds of each round for a configuration ``ratio`` times as fast as fp32 on a busy machine."""
    load = machine_load(rounds, seed=0, low=1.0, high=1.3)
    return jitter([0.1 * x / ratio for x in load], 0.01, seed=seed)


def _run(tmp_path, configs, *, status: str = "complete", name: str = "s.sqlite") -> dict:
    with Store(tmp_path / name) as store:
        return store.load_run(store_run(store, configs, status=status, device="cpu"))


def _one(run) -> object:
    (said,) = headlines(run)
    return said


def test_a_decided_winner_is_named_with_its_interval_weights_and_quality(tmp_path):
    run = _run(tmp_path, [("fp32", _timed(1.0), REF), ("matmul-medium", _timed(1.2, seed=4), _q(119.0, 4 * 2**20)),
                          ("naive-bf16", _timed(2.0, seed=5), _q(38.0)), ("fast", _timed(1.5, seed=6), _q(38.2))])
    said = _one(run)
    assert (said.certainty, said.choice, said.final) == (DECIDED, "naive-bf16", True)
    bf16 = run["configs"][2]
    interval = evidence.speedup(run, bf16)
    assert said.speedup == interval and interval.low > 1.0
    figure = evidence.speedup_cell(interval)  # the figure the table shows: "2.00x (1.98–2.02)"
    shown = f"{figure.split(' ')[0]} {figure.split(' ', 1)[1]} against fp32"
    assert said.text.startswith(f"tts, batch 1: use naive-bf16: {shown}, decided: ")
    assert "paired rounds; weights 2.0 MiB (fp32: 4.0 MiB); SNR 38.0 dB (floor 20 dB)" in said.text
    assert headline_lines(run) == [said.text]


def test_only_indicative_timings_name_the_best_and_how_few_rounds(tmp_path):
    run = _run(tmp_path, [("fp32", [0.10, 0.11], REF), ("fast", [0.05, 0.06], _q(40.0)),
                          ("memory", [0.07, 0.08], _q(41.0))])
    said = _one(run)
    assert (said.certainty, said.choice) == (INDICATIVE, "fast")
    assert "maybe fast: 1.9" in said.text and "indicative: 2 rounds, too few to decide" in said.text
    assert said.text.endswith("nothing was decided faster than fp32: a longer --budget, a higher --repeat or a quieter "
                              "machine decides")


def test_every_round_faster_but_too_few_for_a_95_percent_interval_is_indicative(tmp_path):
    # The table shows 3 rounds all faster as a figure (their range); 3 of 3 happen one time in 8 by chance.
    run = _run(tmp_path, [("fp32", _timed(1.0, 3), REF), ("memory", _timed(1.9, 3, seed=4), _q(47.0)),
                          ("fast", _timed(1.8, 3, seed=5), _q(47.0))])
    interval = evidence.speedup(run, run["configs"][1])
    assert interval.n == 3 and not interval.exact and interval.low > 1.0
    assert "x (" in evidence.speedup_cell(interval)  # a figure in the table
    said = _one(run)
    assert (said.certainty, said.choice) == (INDICATIVE, "memory")
    assert said.text.startswith("tts, batch 1: maybe memory: ")
    assert (f"indicative: 3 rounds, every one faster than fp32 ({evidence.ratio_text(interval.low)}–"
            f"{evidence.ratio_text(interval.high)}), too few for a 95% interval") in said.text
    more = _run(tmp_path, [("fp32", _timed(1.0), REF), ("memory", _timed(1.9, seed=4), _q(47.0))], name="more.sqlite")
    assert _one(more).certainty == DECIDED and "decided: 95% interval of 8 paired rounds" in _one(more).text


def test_an_interval_holding_1_is_indicative_with_its_bounds(tmp_path):
    run = _run(tmp_path, [("fp32", [0.10, 0.13, 0.09, 0.12, 0.10, 0.14], REF),
                          ("fast", [0.12, 0.09, 0.13, 0.08, 0.13, 0.09], _q(40.0))])
    said = _one(run)
    interval = evidence.speedup(run, run["configs"][1])
    assert interval.low < 1.0 < interval.high and interval.value > 1.0
    assert said.certainty == INDICATIVE
    assert (f"indicative: 6 rounds, their interval {evidence.ratio_text(interval.low)}–"
            f"{evidence.ratio_text(interval.high)} holds 1") in said.text


def test_nothing_faster_keeps_fp32(tmp_path):
    run = _run(tmp_path, [("fp32", _timed(1.0), REF), ("quality", _timed(0.95, seed=4), _q(float("inf"), 4 * 2**20)),
                          ("naive-fp16", _timed(0.1, seed=5), _q(45.0))])
    said = _one(run)
    assert (said.certainty, said.choice, said.speedup) == (KEEP, "fp32", None)
    assert said.text == "tts, batch 1: no configuration was measured faster than fp32 here; keep fp32"
    run = _run(tmp_path, [("fp32", [0.10, 0.11], REF), ("fast", [0.12, 0.13], _q(40.0))], name="t.sqlite")
    said = _one(run)  # slower in two rounds: too few to decide it slower
    assert said.certainty == KEEP and said.text.endswith("keep fp32 (undecided against fp32: fast; a longer --budget, "
                                                         "a higher --repeat or a quieter machine decides)")


def test_faster_but_below_its_quality_is_passed_over_and_said(tmp_path):
    # naive-fp16 is fastest but 12 dB; balanced is held to its own 25 dB floor; naive-bf16 to 20 dB.
    run = _run(tmp_path, [("fp32", _timed(1.0), REF), ("naive-fp16", _timed(3.0, seed=4), _q(12.0)),
                          ("balanced", _timed(2.5, seed=5), _q(22.0)), ("naive-bf16", _timed(1.4, seed=6), _q(22.0))])
    said = _one(run)
    assert (said.certainty, said.choice) == (DECIDED, "naive-bf16")
    run = _run(tmp_path, [("fp32", _timed(1.0), REF), ("naive-fp16", _timed(3.0, seed=4), _q(12.0)),
                          ("fast+compile", _timed(2.5, seed=5), _q(19.0)),
                          ("autocast-fp16", _timed(2.0, seed=6), _q(30.0, nonfinite=3))], name="t.sqlite")
    said = _one(run)
    assert (said.certainty, said.choice) == (KEEP, "fp32")
    # a non-finite output counts as a configuration that did not run to the end: the run is partly measured
    assert said.text.startswith("tts, batch 1: not a final result (partly measured): no configuration was measured "
                                "faster than fp32 here; keep fp32 (naive-fp16 ran ")
    assert "x but its SNR 12.0 dB is below its floor of 20 dB; fast+compile ran " in said.text
    assert "x but its SNR 19.0 dB is below its floor of 20 dB" in said.text
    assert said.text.endswith("; and 1 more that fell short)")  # autocast-fp16: faster, but its output was not finite


def test_a_decided_choice_beats_a_faster_one_that_is_only_indicative(tmp_path):
    run = _run(tmp_path, [("fp32", _timed(1.0), REF), ("fast", _timed(1.5, seed=4), _q(38.0)),
                          ("naive-bf16", _timed(3.0, seed=5), _q(38.0, unstable=1))])
    said = _one(run)
    assert (said.certainty, said.choice) == (DECIDED, "fast")
    assert said.text.endswith("x, 8 rounds, timings too spread to trust)")
    assert "; measured faster but only indicative: naive-bf16 (" in said.text


def test_the_stored_speedup_interval_is_what_decides(tmp_path):
    stored = {"speedup": 1.74, "speedup_ci_low": 1.73, "speedup_ci_high": 1.76, "speedup_pairs": 12}
    undecided = {"speedup": 2.5, "speedup_ci_low": 0.9, "speedup_ci_high": 4.0, "speedup_pairs": 2}
    run = _run(tmp_path, [("fp32", _timed(1.0), REF), ("fast", _timed(1.0, seed=4), _q(38.0, **stored)),
                          ("memory", _timed(1.0, seed=5), _q(38.0, **undecided))])
    said = _one(run)
    assert said.choice == "fast" and "use fast: 1.74x (1.73–1.76) against fp32, decided: 95% interval of 12 paired rounds" in said.text
    assert "memory (2.50x, 2 rounds, too few to decide)" in said.text


def test_intervals_that_overlap_the_winners_are_named_as_not_told_apart(tmp_path):
    close = {"speedup": 1.9, "speedup_ci_low": 1.8, "speedup_ci_high": 2.05, "speedup_pairs": 8}
    best = {"speedup": 2.0, "speedup_ci_low": 1.95, "speedup_ci_high": 2.1, "speedup_pairs": 8}
    run = _run(tmp_path, [("fp32", _timed(1.0), REF), ("fast", [0.1] * 8, _q(38.0, **close)),
                          ("naive-bf16", [0.1] * 8, _q(38.0, **best))])
    assert "use naive-bf16: 2.00x" in _one(run).text and "; not told apart from fast (1.90x)" in _one(run).text


def test_a_run_that_is_not_final_says_so_first(tmp_path):
    ids = store_of_states(tmp_path / "states.sqlite")
    with Store(tmp_path / "states.sqlite") as store:
        runs = {state: store.load_run(run_id) for state, run_id in ids.items()}
    assert _one(runs["complete"]).text.startswith("tts, batch 1: use fast: ")
    cancelled = _one(runs["cancelled"])
    assert not cancelled.final and cancelled.text.startswith("tts, batch 1: not a final result (cancelled); so far: use fast: ")
    assert _one(runs["partly measured"]).text.startswith("tts, batch 1: not a final result (partly measured): use fast: ")
    interrupted = _one(runs["interrupted"])  # its only other configuration stopped after one round
    assert interrupted.certainty == KEEP and "(fast ran 2.00x but ended with status partial)" in interrupted.text
    for state in ("reference failed", "nothing measured"):
        said = _one(runs[state])
        assert said.certainty == NOTHING and said.choice is None
        assert said.text == (f"tts, batch 1: not a final result ({state}): the fp32 reference did not run, so nothing "
                             "has a quality or a speed-up to choose by")
    untimed = _one(runs["no timed rounds"])
    assert untimed.certainty == KEEP and "nothing was timed against fp32" in untimed.text


def test_every_batch_has_its_own_headline(tmp_path):
    with Store(tmp_path / "b.sqlite") as store:
        run_id = store.start_run(pipeline="tts", size="test", machine={"name": "m", "device": "cpu"}, fingerprint="f",
                                 versions={}, notes=[])
        for position, (name, batch, ratio, snr) in enumerate([("fp32", 1, 1.0, float("inf")), ("fast", 1, 2.0, 38.0),
                                                              ("fp32", 4, 1.0, float("inf")), ("fast", 4, 0.5, 38.0)]):
            cid = store.add_config(run_id, position=position, name=name, batch=batch)
            for index, seconds in enumerate(_timed(ratio, seed=position)):
                store.add_sample(cid, index, seconds)
            store.finish_config(cid, status="ok", metrics=_q(snr))
        store.finish_run(run_id)
        run = store.load_run(run_id)
    one, four = headlines(run)
    assert (one.batch, one.certainty, one.choice) == (1, DECIDED, "fast")
    assert (four.batch, four.certainty, four.choice) == (4, KEEP, "fp32") and four.text.startswith("tts, batch 4: ")


def test_floors_follow_the_presets():
    assert floor_db("balanced") == floor_db("balanced+compile") == floor_db("balanced+calibrated+compile") == 25.0
    assert floor_db("quality") == float("inf")
    assert floor_db("naive-bf16") == floor_db("mine.toml") == floor_db("fast") == 20.0


def test_json_and_report_carry_the_headline(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        run = store.load_run(write_run(store, "complete"))
    (said,) = headlines(run)
    records = json.loads(export.to_json([run]))
    assert [r["headline"]["text"] for r in records] == [said.text, said.text]
    assert records[0]["headline"]["choice"] == "fast" and records[0]["headline"]["certainty"] == DECIDED
    assert records[0]["headline"]["speedup"]["low"] == pytest.approx(said.speedup.low)
    empty = json.loads(export.to_json([{"id": 9, "pipeline": "tts", "status": "complete", "configs": []}]))
    assert empty[0]["headline"]["certainty"] == NOTHING
    page = report.render_html([run])
    assert "<h3>What to use on test cpu</h3>" in page and html.escape(said.text) in page
    assert page.index("What to use on") < page.index("<h2>Run ")


def test_bench_ends_with_the_headline(tmp_path):
    db = tmp_path / "b.sqlite"
    result = CliRunner().invoke(app, ["bench", "--pipeline", SMALL, "--size", "test", "--configs", "fp32,naive-bf16",
                                      "--repeat", "2", "--warmup", "0", "--db", str(db)], env={"COLUMNS": "120"})  # the path on one line
    assert result.exit_code == 0, result.output
    with Store(db) as store:
        run = store.load_run(1)
    lines = result.output.rstrip("\n").splitlines()
    (said,) = headline_lines(run)
    start = max(i for i, line in enumerate(lines) if line.startswith("what to use on "))
    assert lines[start - 1].startswith("stored as run(s) 1 in ")  # the headline is the last thing said
    assert " ".join(" ".join(lines[start + 1:]).split()) == " ".join(said.split())
    assert said.startswith(f"{SMALL}, batch 1: ")


def test_headlines_are_grouped_per_machine(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        local = store.load_run(write_run(store, "complete"))
        other = store.load_run(write_run(store, "cancelled"))
    node = dict(other, machine={**other["machine"], "node": {"label": "alpha", "host": "h1"}})
    grouped = by_machine([local, node, local])
    assert list(grouped) == ["test cpu", "alpha (h1)"]
    assert grouped["test cpu"] == headline_lines(local) * 2 and grouped["alpha (h1)"] == headline_lines(node)
    assert list(by_machine([dict(local, machine={})])) == ["this machine"]


def test_runs_show_ends_with_the_headline_and_its_json_carries_it(tmp_path):
    db = tmp_path / "s.sqlite"
    with Store(db) as store:
        run = store.load_run(write_run(store, "complete"))
    shown = CliRunner().invoke(app, ["runs", "show", str(run["id"]), "--db", str(db)], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    lines = shown.output.rstrip("\n").splitlines()
    (said,) = headline_lines(run)
    assert lines[-2] == "what to use on test cpu:" and lines[-1].strip() == said
    as_json = CliRunner().invoke(app, ["runs", "show", str(run["id"]), "--db", str(db), "--json"])
    assert "what to use on" not in as_json.output and json.loads(as_json.output)[0]["headline"]["text"] == said


def test_a_configuration_that_computes_exactly_what_fp32_computes_is_never_named(tmp_path):
    """matmul-medium on a CPU whose matmul level changes nothing: fp32's output bit for bit, so its
    measured speed-up is noise, however decided it looks."""
    run = _run(tmp_path, [("fp32", _timed(1.0), REF), ("matmul-medium", _timed(1.3, seed=4), REF),
                          ("fast", _timed(0.9, seed=6), _q(38.2))])
    said = _one(run)
    assert (said.certainty, said.choice) == (KEEP, "fp32")
    assert "matmul-medium ran 1.3" in said.text
    assert "but it computes exactly what fp32 computes here (its output is fp32's, bit for bit)" in said.text
    run = _run(tmp_path, [("fp32", _timed(1.0), REF), ("matmul-medium", _timed(1.3, seed=4), REF),
                          ("naive-bf16", _timed(1.1, seed=5), _q(38.0))], name="t.sqlite")
    assert _one(run).choice == "naive-bf16"  # slower than the exact one, but a real change
