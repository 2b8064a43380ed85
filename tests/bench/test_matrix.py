"""The hardware matrix from stored runs: one column per machine, each against its own fp32."""

from __future__ import annotations

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
    assert matrix.winners == {"a (host-a)": "fast", "b (host-b)": "memory"}
    header, rows = matrix_text_rows(matrix)
    assert header == ["config", "a (host-a)", "b (host-b)"]
    assert rows[1] == ["fast", "* 2.00x, SQNR 35.0 dB, 11 MiB peak", "failed"]
    assert rows[0][1] == "1.00x, SQNR exact, 10 MiB peak"
    assert matrix.summary() == ["a (host-a): fast wins, 2.00x its fp32, SQNR 35.0 dB",
                                "b (host-b): memory wins, 2.00x its fp32, SQNR 40.0 dB"]
    page = render_html(runs)
    assert page.index("<h2>Hardware matrix</h2>") < page.index(f'id="run-{a}"')
    assert 'title="lost with node host-b"' in matrix_html(runs)
    assert matrix_html([runs[0]]) == "" and "Hardware matrix" not in render_html([runs[0]])


def test_a_winner_the_intervals_do_not_support_is_said_to_be_undecided(tmp_path):
    """Runs stored with paired intervals: on b, memory's lead over fast is within noise."""
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
                                                                  "nonfinite": 0})
            store.finish_run(run_id)
            runs.append(store.load_run(run_id))
    (matrix,) = hardware_matrix(runs)
    assert matrix.winners == {"a (host-a)": "fast", "b (host-b)": "memory"}
    assert matrix.contested == {"a (host-a)": None, "b (host-b)": "fast"}
    assert matrix.summary() == ["a (host-a): fast wins, 2.00x (1.80-2.20) its fp32",
                                "b (host-b): memory leads with 1.60x (1.30-2.00) its fp32, undecided against fast on this machine"]
