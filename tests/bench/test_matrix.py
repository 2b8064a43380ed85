"""The hardware matrix from stored runs: one column per machine, each against its own fp32."""

from __future__ import annotations

import re

import pytest

from mixprec.bench.evidence import MIN_PAIRS
from mixprec.bench.matrix import hardware_matrix, machine_label, matrix_html, matrix_runs, matrix_text_rows, spans_machines
from mixprec.bench.report import render_html
from mixprec.bench.store import Store


def _run(store: Store, label: str, fingerprint: str, results: dict[str, tuple[str, list[float], float | None]],
         tag: str | None = None) -> int:
    machine = {"name": f"cpu {label}", "device_type": "cpu", "node": {"label": label, "host": f"host-{label}"}}
    run_id = store.start_run(pipeline="minilm", size="test", machine=machine, fingerprint=fingerprint,
                             versions={"torch": "x"}, notes=[tag] if tag else [])
    base = None
    for position, (name, (status, samples, sqnr)) in enumerate(results.items()):
        config = store.add_config(run_id, position=position, name=name, batch=1)
        median = sorted(samples)[len(samples) // 2]
        base = base or median
        metrics = {"latency_median": median, "speedup": base / median, "peak_mem_bytes": 2**20 * (10 + position),
                   "nonfinite": 0, "sqnr_db": sqnr}
        store.finish_config(config, status=status, metrics=metrics if status == "ok" else {},
                            error=None if status == "ok" else "lost with node host-b")
    store.finish_run(run_id)
    return run_id


def test_each_machine_against_its_own_fp32_and_its_winner(tmp_path):
    with Store(tmp_path / "m.sqlite") as store:
        tag = "hardware matrix 0123 over a, b"
        a = _run(store, "a", "f" * 16, {"fp32": ("ok", [1.0, 1.0, 1.0], float("inf")), "fast": ("ok", [0.5, 0.5, 0.5], 35.0),
                                        "memory": ("ok", [0.8, 0.8, 0.8], 40.0)}, tag)
        b = _run(store, "b", "e" * 16, {"fp32": ("ok", [0.1, 0.1, 0.1], float("inf")), "fast": ("failed", [1.0], None),
                                        "memory": ("ok", [0.05, 0.05, 0.05], 40.0)}, tag)
        alone = _run(store, "a", "f" * 16, {"fp32": ("ok", [1.0], float("inf"))})
        runs = [store.load_run(i) for i in (a, b)]
        assert [r["id"] for r in matrix_runs(store, runs[1])] == [a, b]
        assert [r["id"] for r in matrix_runs(store, store.load_run(alone))] == [alone]
    assert spans_machines(runs) and not spans_machines([runs[0], runs[0]])
    assert machine_label(runs[0]) == "a (host-a)"
    (matrix,) = hardware_matrix(runs)
    assert matrix.configs == ["fp32", "fast", "memory"] and matrix.machines == ["a (host-a)", "b (host-b)"]
    # b is ten times faster in absolute terms; its speed-ups are still against its own fp32
    assert matrix.cells[("memory", "b (host-b)")].speedup == 2.0
    assert matrix.cells[("fast", "a (host-a)")].speedup == 2.0
    # ratios stored without an interval: figures, yet no speed-up and no winner
    assert matrix.winners == {"a (host-a)": None, "b (host-b)": None}
    header, rows = matrix_text_rows(matrix)
    assert header == ["config", "a (host-a)", "b (host-b)"]
    assert rows[1] == ["fast", "undecided (no interval), SQNR 35.0 dB, 11 MiB peak", "failed"]
    assert rows[0][1] == "reference, SQNR exact, 10 MiB peak"
    assert matrix.summary() == [
        "a (host-a): undecided which is fastest on this machine: fast reads undecided (no interval) and memory reads "
        "undecided (no interval); a winner needs every speed-up from at least 3 paired rounds of steady timings",
        "b (host-b): undecided which is fastest on this machine: memory reads undecided (no interval); a winner needs "
        "every speed-up from at least 3 paired rounds of steady timings"]
    page = render_html(runs)
    assert page.index("<h2>Hardware matrix</h2>") < page.index(f'id="run-{a}"')
    assert 'title="lost with node host-b"' in matrix_html(runs)
    assert matrix_html([runs[0]]) == "" and "Hardware matrix" not in render_html([runs[0]])


def test_a_winner_the_intervals_do_not_support_is_said_to_be_undecided(tmp_path):
    """Runs stored with paired intervals: on b, memory's point figure leads fast's within the noise."""
    with Store(tmp_path / "m.sqlite") as store:
        runs = []
        for label, fast, memory in (("a", (2.0, 1.8, 2.2), (1.2, 1.1, 1.3)), ("b", (1.5, 1.2, 1.9), (1.6, 1.3, 2.0))):
            machine = {"name": f"cpu {label}", "device_type": "cpu", "node": {"label": label, "host": f"host-{label}"}}
            run_id = store.start_run(pipeline="minilm", size="test", machine=machine, fingerprint=label * 16,
                                     versions={"torch": "x"}, notes=[])
            for position, (name, (value, low, high)) in enumerate({"fp32": (1.0, 1.0, 1.0), "fast": fast,
                                                                   "memory": memory}.items()):
                config = store.add_config(run_id, position=position, name=name, batch=1)
                store.finish_config(config, status="ok", metrics={"latency_median": 1 / value, "speedup": value,
                                                                  "speedup_ci_low": low, "speedup_ci_high": high,
                                                                  "speedup_pairs": 8, "nonfinite": 0})
            store.finish_run(run_id)
            runs.append(store.load_run(run_id))
    (matrix,) = hardware_matrix(runs)
    assert matrix.winners == {"a (host-a)": "fast", "b (host-b)": None}
    assert matrix.undecided == {"a (host-a)": None, "b (host-b)": "undecided which is fastest on this machine: the "
                                "intervals of memory (1.30–2.00) and fast (1.20–1.90) overlap"}
    assert matrix.summary() == ["a (host-a): fast is fastest, 2.00x (1.80–2.20) its fp32, above every other "
                                "configuration's interval",
                                "b (host-b): undecided which is fastest on this machine: the intervals of memory "
                                "(1.30–2.00) and fast (1.20–1.90) overlap"]


_FIGURE = re.compile(r"^(\d+(\.\d+)?|\d\.\de[-+]\d+)x \(")

#: (name, status, samples by round, stored metrics) per configuration; fp32 first, as the runner times it.
_STEADY = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0]


def _interval(value, low, high, pairs=8, **more):
    return {"speedup": value, "speedup_ci_low": low, "speedup_ci_high": high, "speedup_pairs": pairs, **more}


class TestEveryCellAndWinnerFollowsItsInterval:
    """Whatever a run stored (paired intervals, samples only, a bare ratio, one sample, spread
    timings), a cell reads as a speed-up only where its interval supports one, and a machine's
    winner is named only where its interval lies above every other configuration's."""

    CASES = {
        "clear winner": ([("fast", "ok", None, _interval(2.0, 1.8, 2.2)), ("memory", "ok", None, _interval(1.2, 1.1, 1.3))],
                         "fast", {"fast": "2.00x (1.80–2.20)", "memory": "1.20x (1.10–1.30)"}),
        "intervals overlap": ([("fast", "ok", None, _interval(1.5, 1.2, 1.9)), ("memory", "ok", None, _interval(1.6, 1.3, 2.0))],
                              None, {"fast": "1.50x (1.20–1.90)", "memory": "1.60x (1.30–2.00)"}),
        "interval crossing 1": ([("fast", "ok", None, _interval(1.05, 0.9, 1.2)), ("memory", "ok", None, _interval(0.8, 0.7, 0.9))],
                                None, {"fast": "undecided (0.90–1.20)", "memory": "0.80x (0.70–0.90)"}),
        "every one slower": ([("fast", "ok", None, _interval(0.5, 0.45, 0.55)), ("memory", "ok", None, _interval(0.8, 0.7, 0.9))],
                             "fp32", {"fast": "0.50x (0.45–0.55)", "memory": "0.80x (0.70–0.90)"}),
        "bare ratio, no interval": ([("fast", "ok", None, {"speedup": 2.0}), ("memory", "ok", None, _interval(1.2, 1.1, 1.3))],
                                    None, {"fast": "undecided (no interval)", "memory": "1.20x (1.10–1.30)"}),
        "one sample": ([("fast", "ok", [0.25], {}), ("memory", "ok", None, _interval(1.2, 1.1, 1.3))],
                       None, {"fast": "undecided (n=1)", "memory": "1.20x (1.10–1.30)"}),
        "two paired rounds": ([("fast", "ok", [0.5, 0.5], {})], None, {"fast": "undecided (n=2)"}),
        "paired samples only": ([("fast", "ok", [s / 2 for s in _STEADY], {}), ("memory", "ok", _STEADY, {})],
                                "fast", {"fast": "2.00x (2.00–2.00)", "memory": "undecided (1.00–1.00)"}),
        "unstable timings": ([("fast", "ok", None, _interval(2.0, 1.8, 2.2, unstable=1.0)),
                              ("memory", "ok", None, _interval(1.2, 1.1, 1.3))],
                             None, {"fast": "unstable (1.80–2.20)", "memory": "1.20x (1.10–1.30)"}),
        "the fastest failed": ([("fast", "failed", None, {}), ("memory", "ok", None, _interval(1.2, 1.1, 1.3))],
                               "memory", {"memory": "1.20x (1.10–1.30)"}),
        "the fastest made non-finite outputs": ([("fast", "ok", None, _interval(3.0, 2.5, 3.5, nonfinite=4)),
                                                 ("memory", "ok", None, _interval(1.2, 1.1, 1.3))],
                                                "memory", {"fast": "3.00x (2.50–3.50)", "memory": "1.20x (1.10–1.30)"}),
        "only fp32 ran": ([("fast", "failed", None, {})], "fp32", {}),
    }

    @staticmethod
    def _runs(tmp_path, configs):
        """Two machines measuring the same configurations, each against its own fp32."""
        with Store(tmp_path / "m.sqlite") as store:
            ids = []
            for label, scale in (("a", 1.0), ("b", 0.1)):  # b is ten times faster in absolute terms
                machine = {"name": f"cpu {label}", "device_type": "cpu", "node": {"label": label, "host": f"host-{label}"}}
                run_id = store.start_run(pipeline="minilm", size="test", machine=machine, fingerprint=label * 16,
                                         versions={"torch": "x"}, notes=[])
                for position, (name, status, samples, metrics) in enumerate([("fp32", "ok", _STEADY, {"nonfinite": 0}),
                                                                             *configs]):
                    config = store.add_config(run_id, position=position, name=name, batch=1)
                    for index, seconds in enumerate(samples or []):
                        store.add_sample(config, index, seconds * scale)
                    store.finish_config(config, status=status, metrics=metrics if status == "ok" else {},
                                        error=None if status == "ok" else "RuntimeError: no kernel")
                store.finish_run(run_id)
                ids.append(run_id)
            return [store.load_run(i) for i in ids]

    @pytest.mark.parametrize("case", list(CASES))
    def test_cells_and_winner(self, tmp_path, case):
        configs, winner, shown = self.CASES[case]
        runs = self._runs(tmp_path, configs)
        (matrix,) = hardware_matrix(runs)
        header, rows = matrix_text_rows(matrix)
        page = matrix_html(runs)
        for machine in matrix.machines:
            assert matrix.winners[machine] == winner
            for name, text in shown.items():
                assert matrix.cells[(name, machine)].speed_text == text
            usable = {c: matrix.cells[(c, machine)] for c in matrix.configs if matrix.cells[(c, machine)].usable}
            for name in matrix.configs:
                cell = matrix.cells[(name, machine)]
                text = cell.speed_text
                if _FIGURE.match(text):  # a figure alone: an interval that decides, wholly on one side of 1
                    interval = cell.interval
                    assert interval.usable and not cell.unstable and (interval.n is None or interval.n >= MIN_PAIRS)
                    assert interval.low > 1 or interval.high < 1, (name, text)
                else:
                    assert text in ("reference", "—") or text.startswith(("undecided (", "unstable (")), text
            if winner is not None:
                best = usable[winner].interval
                assert all(c.supported for c in usable.values())
                assert all(best.low > c.interval.high for n, c in usable.items() if n != winner)
                assert matrix.undecided[machine] is None
            else:  # undecided, and the line says why
                assert matrix.undecided[machine].startswith("undecided which is fastest on this machine: ")
                assert any(not c.supported for c in usable.values()) or "overlap" in matrix.undecided[machine]
        # the winner, and only the winner, is marked in the terminal and the report
        column = {m: header.index(m) for m in matrix.machines}
        marked = {(row[0], m) for row in rows for m in matrix.machines if row[column[m]].startswith("* ")}
        assert marked == ({(winner, m) for m in matrix.machines} if winner else set())
        assert page.count("<strong>") == (len(matrix.machines) if winner else 0) + 1  # + the legend's "Bold"
        lines = matrix.summary()
        assert len(lines) == len(matrix.machines)
        for machine, line in zip(matrix.machines, lines):
            said = line.removeprefix(f"{machine}: ")
            if winner is None:
                assert said == matrix.undecided[machine]
            else:
                assert said.startswith((f"{winner} is fastest, ", f"{winner} (the reference) is fastest: "))
