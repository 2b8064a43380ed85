"""Opening a store: every broken kind of path or store is refused before any work, with a
message naming the source and what to do, and the path is left as it was."""

from __future__ import annotations

import os
import socket
import sqlite3
from pathlib import Path

import pytest

from mixprec.bench.store import Store, StoreError


def _store(path: Path) -> Path:
    with Store(path) as store:
        run = store.start_run(pipeline="tts", size="test", machine={"device_type": "cpu"}, fingerprint="f",
                              versions={}, notes=[])
        store.add_config(run, position=0, name="fp32", batch=1)
    return path


def _damage(*statements: str):
    def make(tmp: Path) -> Path:
        path = _store(tmp / "s.sqlite")
        db = sqlite3.connect(path)
        for statement in statements:
            db.execute(statement)
        db.commit()
        db.close()
        return path
    return make


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "pipe.sqlite")
    return tmp / "pipe.sqlite"


def _socket(tmp: Path) -> Path:
    path = tmp / "sock.sqlite"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()
    return path


def _folder(tmp: Path) -> Path:
    (tmp / "d.sqlite").mkdir()
    return tmp / "d.sqlite"


def _under_a_file(tmp: Path) -> Path:
    (tmp / "plain").write_text("x")
    return tmp / "plain" / "s.sqlite"


#: (how to make the path, what the message says)
BROKEN = {
    "directory": (_folder, "is a directory, not a file; give a file name inside it"),
    "fifo": (_fifo, "is a named pipe (FIFO), not a regular file"),
    "device": (lambda tmp: Path("/dev/null"), "is a device, not a regular file"),
    "socket": (_socket, "is a socket, not a regular file"),
    "missing folder": (lambda tmp: tmp / "no" / "such" / "s.sqlite", "the folder '{tmp}/no' does not exist"),
    "folder is a file": (_under_a_file, "plain' is a file, not a directory"),
    "no configs table": (_damage("DROP TABLE configs"), "claims schema version 4 but lacks table configs"),
    "no samples, no metrics": (_damage("DROP TABLE samples", "DROP TABLE metrics"), "lacks table metrics, table samples"),
    "a column missing": (_damage("ALTER TABLE runs DROP COLUMN command"), "lacks column runs.command"),
    "version 2 without profile rows": (_damage("DROP TABLE profile_rows", "UPDATE meta SET value='2' WHERE key='schema_version'"),
                                       "claims schema version 2 but lacks table profile_rows"),
    "version not a number": (_damage("UPDATE meta SET value='four' WHERE key='schema_version'"),
                             "claims schema version 'four' (not a whole number from 1 to 4)"),
    "version missing": (_damage("DELETE FROM meta WHERE key='schema_version'"), "claims schema version 'None'"),
    "meta without values": (_damage("ALTER TABLE meta RENAME COLUMN value TO v"), "lacks column meta.value"),
}


def _snapshot(path: Path) -> tuple[bool, bytes | None]:
    if not os.path.lexists(path):
        return False, None
    return True, path.read_bytes() if path.is_file() else None


class TestBrokenStores:
    @pytest.mark.parametrize("kind", sorted(BROKEN))
    @pytest.mark.parametrize("source", ["path", "MIXPREC_DB"])
    def test_refused_before_any_work_and_left_as_it_was(self, kind, source, tmp_path, clean_env):
        make, expected = BROKEN[kind]
        path = make(tmp_path)
        before = sorted(p.name for p in tmp_path.rglob("*")), _snapshot(path)
        # Holding the FIFO open for reading and writing: an implementation that opened it would
        # not block the test, it would read nothing and fail on the message instead.
        held = os.open(path, os.O_RDWR | os.O_NONBLOCK) if kind == "fifo" else None
        try:
            if source == "MIXPREC_DB":
                clean_env.setenv("MIXPREC_DB", str(path))
            with pytest.raises(StoreError) as info:
                Store(str(path) if source == "path" else None)
        finally:
            if held is not None:
                os.close(held)
        message = str(info.value)
        assert expected.format(tmp=tmp_path) in message, message
        assert message.startswith(f"{'store path' if source == 'path' else 'MIXPREC_DB'} '{path}'")
        assert any(advice in message for advice in ("choose another", "give a file name", "give the path of a SQLite file"))
        assert (sorted(p.name for p in tmp_path.rglob("*")), _snapshot(path)) == before  # nothing created or changed

    @pytest.mark.parametrize("sub", ["s.sqlite", "a/s.sqlite", "a/b/c/s.sqlite"])
    def test_only_mixprecs_own_data_folder_is_created(self, sub, tmp_path, clean_env):
        clean_env.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
        with Store() as store:  # the default store: its folder is mixprec's own
            assert store.path == tmp_path / "xdg" / "mixprec" / "bench.sqlite" and store.path.is_file()
        for source in ("--db", "MIXPREC_DB"):  # a folder the user named is never made, whichever way it was named
            named = tmp_path / "named" / sub
            if source == "MIXPREC_DB":
                clean_env.setenv("MIXPREC_DB", str(named))
            with pytest.raises(StoreError, match=f"^{source} .* does not exist; mixprec creates no folder but its own"):
                Store(str(named) if source == "--db" else None, source=source)
            assert not (tmp_path / "named").exists()
            named.parent.mkdir(parents=True)
            Store(str(named) if source == "--db" else None, source=source).close()
            assert named.is_file()
            named.unlink()
            (tmp_path / "named").chmod(0o700)
            import shutil

            shutil.rmtree(tmp_path / "named")

    @pytest.mark.parametrize("version", [1, 2, 3, 4])
    def test_every_complete_schema_opens(self, version, tmp_path):
        path = tmp_path / "s.sqlite"
        Store(path, target_version=version).close()
        with Store(path) as store:  # migrated from ``version`` to the newest
            assert store.runs() == []
