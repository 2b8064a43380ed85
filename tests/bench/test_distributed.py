"""The benchmark on a real local Ray cluster with two hardware types: one run per type in one
store, the hardware matrix in compare and the report, and a node lost mid-run."""

from __future__ import annotations

import os
import threading
import time

import pytest
from typer.testing import CliRunner

from ray_cluster import ON_THE_CLUSTER, ray_or_skip, two_types

ray_or_skip()
pytestmark = ON_THE_CLUSTER

from mixprec.bench.configs import parse_configs  # noqa: E402
from mixprec.bench.distributed import probe_groups, run_matrix  # noqa: E402
from mixprec.bench.matrix import hardware_matrix  # noqa: E402
from mixprec.bench.runner import BenchOptions  # noqa: E402
from mixprec.bench.store import Store  # noqa: E402
from mixprec.cli import app  # noqa: E402
from mixprec.measure.cluster import node_groups, select_groups  # noqa: E402

#: A pipeline whose workers import nothing beyond torch and run in well under a millisecond
#: (tests/small_factory.py; tests/ is on the cluster workers' path): these tests are about where
#: the runs go and what is stored, not about what a model computes.
SMALL = "small_factory:build"


def test_bench_on_every_hardware_type_stores_one_run_each_and_the_matrix(tmp_path):
    ray, _ = two_types()
    db, html = tmp_path / "b.sqlite", tmp_path / "r.html"
    runner = CliRunner()
    result = runner.invoke(app, ["bench", "--executor", "ray", "--hardware", "all", "--pipeline", SMALL, "--size", "test",
                                 "--configs", "fp32,memory", "--repeat", "2", "--warmup", "0", "--db", str(db), "--html", str(html)],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    store = Store(db)
    # The two runs start at the same time: which gets id 1 is the store's first come.
    runs = sorted((store.load_run(i) for i in (1, 2)), key=lambda r: r["machine"]["node"]["label"])
    assert [r["machine"]["node"]["label"] for r in runs] == ["alpha", "beta"]
    groups = {g.label: g for g in node_groups(ray)}
    for run in runs:
        label = run["machine"]["node"]["label"]
        assert run["status"] == "complete" and run["machine_fingerprint"] and run["versions"]["torch"]
        assert run["machine"]["node"]["node_id"] in groups[label].node_ids  # probed on its own node
        assert {c["name"]: c["status"] for c in run["configs"]} == {"fp32": "ok", "memory": "ok"}
        fp32 = next(c for c in run["configs"] if c["name"] == "fp32")
        assert fp32["metrics"]["speedup"] == pytest.approx(1.0)  # each run against its own fp32
        assert any(f"Ray hardware {label!r}" in note for note in run["notes"])
    (matrix,) = hardware_matrix(runs)
    assert [m.split()[0] for m in matrix.machines] == ["alpha", "beta"]
    # two timed rounds give no interval: no speed-up is shown and no winner named
    assert all(matrix.winners[m] is None for m in matrix.machines)
    assert all(matrix.cells[("memory", m)].speed_text == "undecided (n=2)" for m in matrix.machines)
    assert f"hardware matrix: {SMALL} (test), batch 1" in result.output
    # Each machine's line says why no configuration is named the fastest there.
    assert all(any(line.startswith(f"{m}: undecided which is fastest on this machine: memory reads undecided (n=2)")
                   for line in matrix.summary()) for m in matrix.machines)
    assert "undecided which is fastest" in result.output
    # the last lines: what to use on each hardware type, from its own run
    said = result.output[result.output.index("what to use on alpha ("):]
    assert "what to use on beta (" in said and said.count(f"{SMALL}, batch 1: ") == 2
    page = html.read_text()
    assert "<h2>Hardware matrix</h2>" in page and "alpha" in page and "beta" in page
    from mixprec.ui.bench_tab import show_run

    frame = show_run(str(db), 2)  # the UI shows a run of a matrix with the others, under their table
    assert "Hardware matrix" in frame and "alpha" in frame and "Run 1" in frame
    shown = runner.invoke(app, ["compare", "1", "2", "--db", str(db)])
    assert shown.exit_code == 0 and "hardware matrix" in shown.output and "memory" in shown.output
    # a label no node has: exit 2 before any work, naming what was asked and what is there
    bad = runner.invoke(app, ["bench", "--executor", "ray", "--hardware", "alpha,tpu", "--pipeline", SMALL, "--size", "test",
                              "--db", str(db)])
    assert bad.exit_code == 2 and "'tpu'" in bad.output and "alpha" in bad.output and "beta" in bad.output
    assert len(Store(db).runs()) == 2


@pytest.mark.skipif(os.environ.get("MIXPREC_HEAVY") != "1", reason="starts and kills a third node: set MIXPREC_HEAVY=1")
def test_a_node_lost_mid_run_fails_its_configurations_and_names_it(tmp_path):
    ray, cluster = two_types()
    doomed = cluster.add_node(num_cpus=2, resources={"mixprec-hw:doomed": 1})
    cluster.wait_for_nodes()
    try:
        parts = probe_groups(ray, select_groups(node_groups(ray), "alpha,doomed"), "cpu")
        specs, _ = parse_configs("fp32,memory", parts[0].hardware)
        options = BenchOptions(pipeline="minilm", configs=specs, repeat=40, warmup=0, size="test")
        seen: list[tuple[str, str]] = []
        killed = threading.Event()

        def progress(label: str, description: str, n: int) -> None:
            seen.append((label, description))
            if label == "doomed" and description.startswith("batch 1: run") and not killed.is_set():
                killed.set()
                threading.Thread(target=cluster.remove_node, args=(doomed,), daemon=True).start()

        run_ids = run_matrix(options, parts, tmp_path / "b.sqlite", ray, progress=progress)
        assert killed.is_set()
        store = Store(tmp_path / "b.sqlite")
        alpha, lost = (store.load_run(i) for i in run_ids)
        assert {c["status"] for c in alpha["configs"]} == {"ok"}  # nothing from the other node is lost
        assert all(len(c["samples"]) == 40 for c in alpha["configs"])
        # failed as lost when the node went (a hang would end at the time limit, as "timeout"),
        # and cut short: fewer than the 40 runs asked for
        assert {c["status"] for c in lost["configs"]} == {"failed"}
        assert all(len(c["samples"]) < 40 for c in lost["configs"])
        for config in lost["configs"]:
            assert "hardware 'doomed'" in config["error"] and "lost" in config["error"]
            assert parts[1].probe["node"]["node_id"][:12] in config["error"]
    finally:
        if doomed in cluster.worker_nodes:
            cluster.remove_node(doomed)


@pytest.mark.skipif(os.environ.get("MIXPREC_HEAVY") != "1", reason="a long run interrupted on the cluster: set MIXPREC_HEAVY=1")
def test_ctrl_c_stops_the_remote_workers_and_keeps_what_was_measured(tmp_path):
    import _thread

    ray, _ = two_types()
    parts = probe_groups(ray, select_groups(node_groups(ray), "alpha,beta"), "cpu")
    specs, _ = parse_configs("fp32,memory", parts[0].hardware)
    options = BenchOptions(pipeline="minilm", configs=specs, repeat=200, warmup=0, size="test")
    interrupted, once = threading.Event(), threading.Lock()

    def progress(label: str, description: str, n: int) -> None:
        with once:  # one Ctrl-C (both runs report progress)
            if description.startswith("batch 1: run") and not interrupted.is_set():
                interrupted.set()
                _thread.interrupt_main()  # what Ctrl-C does to the command's main thread

    with pytest.raises(KeyboardInterrupt):
        run_matrix(options, parts, tmp_path / "b.sqlite", ray, progress=progress)
    store = Store(tmp_path / "b.sqlite")
    runs = [store.load_run(r["id"]) for r in store.runs()]
    assert len(runs) == 2 and {r["status"] for r in runs} == {"cancelled"}
    for run in runs:
        assert all(c["status"] in ("partial", "failed") and len(c["samples"]) < 200 for c in run["configs"])
    # no worker of these runs is left on the cluster
    time.sleep(2)
    alive = [a for a in ray._private.state.actors().values() if a["ActorClassName"] == "_Host" and a["State"] == "ALIVE"]
    assert alive == []
