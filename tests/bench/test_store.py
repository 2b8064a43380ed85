from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import pytest

from mixprec.bench.store import MIGRATIONS, SCHEMA_VERSION, Store, StoreError

MACHINE = {"device_type": "cpu", "name": "test cpu"}


def _run(store: Store, pipeline: str = "tts", configs: int = 2) -> int:
    run_id = store.start_run(pipeline=pipeline, size="test", machine=MACHINE, fingerprint="f", versions={"torch": "x"}, notes=["n"])
    for i in range(configs):
        cid = store.add_config(run_id, position=i, name=f"c{i}", batch=1)
        for j in range(3):
            store.add_sample(cid, j, 0.1 * (i + 1) + j * 0.001)
        store.finish_config(cid, status="ok", metrics={"latency_median": 0.1 * (i + 1), "sqnr_db": float("inf"), "nonfinite": 0},
                            policy={"name": f"c{i}"})
    return run_id


def test_round_trip(tmp_path):
    with Store(tmp_path / "b.sqlite") as store:
        run_id = _run(store)
        store.finish_run(run_id)
        run = store.load_run(run_id)
    assert run["status"] == "complete" and run["pipeline"] == "tts" and run["machine"] == MACHINE
    assert [c["name"] for c in run["configs"]] == ["c0", "c1"]
    assert run["configs"][1]["samples"] == pytest.approx([0.2, 0.201, 0.202])
    assert run["configs"][0]["metrics"]["sqnr_db"] == float("inf")
    assert run["configs"][0]["policy"] == {"name": "c0"}
    with sqlite3.connect(tmp_path / "b.sqlite") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_interrupted_run_stays_incomplete_and_keeps_what_it_measured(tmp_path):
    with Store(tmp_path / "b.sqlite") as store:
        run_id = _run(store, configs=1)  # no finish_run: the process was interrupted
        run = Store(tmp_path / "b.sqlite").load_run(run_id)
    assert run["status"] == "incomplete" and run["finished"] is None
    assert len(run["configs"][0]["samples"]) == 3


def test_migration_from_version_1_keeps_data(tmp_path):
    path = tmp_path / "old.sqlite"
    with Store(path, target_version=1) as old:
        assert old.schema_version == 1
        old._conn.execute("BEGIN")
        old._conn.execute("INSERT INTO runs(started, status, pipeline, machine_json, machine_fingerprint, versions_json) "
                          "VALUES ('2026-01-01 00:00:00', 'complete', 'tts', '{}', 'f', '{}')")
        old._conn.execute("COMMIT")
    with Store(path) as store:
        assert store.schema_version == SCHEMA_VERSION == len(MIGRATIONS)
        run = store.load_run(1)
        assert run["pipeline"] == "tts" and run["size"] == "default"  # the column added in version 2
        store.add_profile_rows(1, "memory", [{"module": "vae.conv_out", "own_sqnr_db": 30.0}])


@pytest.mark.parametrize("content", [b"this is a text file, not a database", b"\x00" * 64])
def test_foreign_files_are_refused_and_untouched(tmp_path, content):
    path = tmp_path / "notes.sqlite"
    path.write_bytes(content)
    with pytest.raises(StoreError, match="not a SQLite database; refusing"):
        Store(path)
    assert path.read_bytes() == content


def test_another_applications_database_is_refused(tmp_path):
    path = tmp_path / "app.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users (id INTEGER)")
    before = path.read_bytes()
    with pytest.raises(StoreError, match="another application's database"):
        Store(path)
    assert path.read_bytes() == before


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.sqlite"
    with Store(path) as store:
        store._conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(StoreError, match="schema version 99, newer"):
        Store(path)


def test_unknown_run_lists_recent_ones(tmp_path):
    with Store(tmp_path / "b.sqlite") as store:
        _run(store)
        with pytest.raises(StoreError, match="no run 42 .* recent runs: 1"):
            store.load_run(42)


WRITER = textwrap.dedent("""
    import sys
    from mixprec.bench.store import Store
    store = Store(sys.argv[1])
    for i in range(25):
        run = store.start_run(pipeline=sys.argv[2], size="test", machine={}, fingerprint="f", versions={}, notes=[])
        cid = store.add_config(run, position=0, name="fp32", batch=1)
        for j in range(4):
            store.add_sample(cid, j, 0.01 * j)
        store.finish_config(cid, status="ok", metrics={"latency_median": 0.02})
        store.finish_run(run)
""")


def test_two_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "shared.sqlite"
    Store(path).close()
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    procs = [subprocess.Popen([sys.executable, str(script), str(path), name]) for name in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM runs WHERE status='complete'").fetchone()[0] == 50
        assert db.execute("SELECT COUNT(*) FROM samples").fetchone()[0] == 200
        assert sorted(r[0] for r in db.execute("SELECT pipeline FROM runs GROUP BY pipeline")) == ["a", "b"]
