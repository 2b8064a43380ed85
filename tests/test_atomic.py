"""mixprec._atomic.write_text: the probe cache, calibration decisions and fallback records are
replaced whole or not at all, by racing processes and threads, and on a failed write."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import threading

import pytest

from mixprec._atomic import write_text


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def _write_many(path: str, tag: int, times: int = 40) -> None:
    for i in range(times):
        write_text(path, json.dumps({"writer": tag, "i": i, "pad": "x" * 20000}))


def test_racing_threads_and_processes_leave_one_whole_file(tmp_path):
    path = tmp_path / "probe.json"
    threads = [threading.Thread(target=_write_many, args=(str(path), t)) for t in range(4)]
    procs = [multiprocessing.get_context("spawn").Process(target=_write_many, args=(str(path), 10 + p)) for p in range(2)]
    for worker in (*threads, *procs):
        worker.start()
    for worker in (*threads, *procs):
        worker.join(timeout=120)
    assert all(p.exitcode == 0 for p in procs)
    record = json.loads(path.read_text(encoding="utf-8"))  # whole: one writer's text, not a mix
    assert record["writer"] in {0, 1, 2, 3, 10, 11} and len(record["pad"]) == 20000
    assert _leftovers(tmp_path) == []


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "decision.json"
    write_text(path, '{"old": true}')
    with pytest.raises(UnicodeEncodeError):
        write_text(path, '{"new": "\udc80"}')  # a lone surrogate: fails while writing
    assert path.read_text(encoding="utf-8") == '{"old": true}' and _leftovers(tmp_path) == []
    with pytest.raises(OSError):
        write_text(tmp_path / "no-such-folder" / "x.json", "{}")
    assert _leftovers(tmp_path) == []


def test_modes_follow_the_old_file_else_the_umask_else_the_one_asked(tmp_path):
    old = tmp_path / "old.json"
    old.write_text("{}")
    os.chmod(old, 0o600)
    write_text(old, "[]")
    assert stat.S_IMODE(old.stat().st_mode) == 0o600 and old.read_text() == "[]"
    umask = os.umask(0o022)
    try:
        new = write_text(tmp_path / "new.json", "{}")
        assert stat.S_IMODE(new.stat().st_mode) == 0o644
    finally:
        os.umask(umask)
    assert stat.S_IMODE(write_text(tmp_path / "asked.json", "{}", mode=0o640).stat().st_mode) == 0o640
