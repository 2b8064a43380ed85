"""The store while another process holds it (waited for, said once) and when the disk fills (a clear StoreError)."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from typer.testing import CliRunner

from mixprec.bench.store import Store, StoreError
from mixprec.cli import app

RUN = dict(pipeline="tts", size="test", machine={"name": "m"}, fingerprint="f", versions={}, notes=[])


def _hold(path, seconds: float) -> threading.Thread:
    """Another connection (another process, to SQLite) holds the write lock for ``seconds``."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")

    def release() -> None:
        time.sleep(seconds)
        other.execute("COMMIT")
        other.close()

    thread = threading.Thread(target=release)
    thread.start()
    return thread


def test_a_write_waits_for_another_process_and_says_so_once(tmp_path):
    path = tmp_path / "b.sqlite"
    messages: list[str] = []
    store = Store(path, on_wait=messages.append)
    holder = _hold(path, 2.5)  # longer than SQLite's own busy wait
    run_id = store.start_run(**RUN)
    holder.join()
    assert run_id == 1 and store.load_run(1)["status"] == "incomplete"
    assert len(messages) == 1 and "in use by another process" in messages[0] and str(path) in messages[0]


def test_a_lock_held_too_long_fails_clearly_and_writes_nothing(tmp_path):
    path = tmp_path / "b.sqlite"
    store = Store(path, lock_wait_s=0.5, on_wait=lambda m: None)
    holder = _hold(path, 3.5)
    with pytest.raises(StoreError, match="stayed locked by another process.*nothing was written"):
        store.start_run(**RUN)
    holder.join()
    assert store.runs() == []


def test_a_full_disk_is_named_and_keeps_what_was_stored(tmp_path):
    store = Store(tmp_path / "b.sqlite")
    run_id = store.start_run(**RUN)
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages}")  # the file cannot grow: SQLite reports SQLITE_FULL
    with pytest.raises(StoreError, match="the disk is full.*what was stored before is kept"):
        for index in range(10_000):
            store.finish_run(run_id, notes=["x" * 4000 + str(index)])
            store.start_run(**{**RUN, "notes": ["y" * 4000]})
    assert store.load_run(run_id)["pipeline"] == "tts"


@pytest.mark.parametrize("bad", [0, -1, 2**63, 10**20, True, "1"])
def test_ids_out_of_range_are_a_store_error(tmp_path, bad):
    with pytest.raises(StoreError, match="is not valid"):
        Store(tmp_path / "b.sqlite").load_run(bad)
    with pytest.raises(StoreError, match="is not valid"):
        Store(tmp_path / "b.sqlite").load_tune_run(bad)


def test_the_cli_waits_for_a_locked_store_with_a_message(tmp_path, clean_env):
    path = tmp_path / "b.sqlite"
    Store(path).close()
    holder = _hold(path, 2.5)
    result = CliRunner().invoke(app, ["runs", "list", "--db", str(path)])
    holder.join()
    assert result.exit_code == 0, result.output
    assert "waiting: " in result.output and "in use by another process" in result.output
    assert "runs in" in result.output


def test_names_that_are_not_utf8_are_kept_escaped(tmp_path):
    """A file name decoded from bytes that are not UTF-8 holds lone surrogates, which SQLite cannot store."""
    with Store(tmp_path / "b.sqlite") as store:
        run_id = store.start_run(**{**RUN, "pipeline": "/data/caf\udce9.py:build"}, command="mixprec bench \udce9")
        config_id = store.add_config(run_id, position=0, name="p\udcff.toml", batch=1)
        store.finish_config(config_id, status="error", metrics={}, error="cannot open \udce9")
        run = store.load_run(run_id)
    assert run["pipeline"] == "/data/caf\\udce9.py:build" and run["command"] == "mixprec bench \\udce9"
    assert run["configs"][0]["name"] == "p\\udcff.toml" and run["configs"][0]["error"] == "cannot open \\udce9"


def test_write_errors_say_what_the_disk_did():
    from mixprec.bench.store import _write_problem

    assert _write_problem(sqlite3.OperationalError("database or disk is full")) == "the disk is full"
    assert _write_problem(sqlite3.OperationalError("disk I/O error")) == "the disk is full or failing"
    assert _write_problem(sqlite3.OperationalError("attempt to write a readonly database")).endswith("read-only")
    assert _write_problem(sqlite3.OperationalError("no such table: runs")) is None
