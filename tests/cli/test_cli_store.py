"""Every command that opens a store refuses a broken one the same way, whether it was named
by ``--db`` or ``MIXPREC_DB``: exit status 2, the source, the path and the reason, nothing created."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mixprec.bench.store import Store
from mixprec.cli import app
from stored_runs import store_run

runner = CliRunner()

COMMANDS = {
    "runs list": ["runs", "list"],
    "runs list --json": ["runs", "list", "--json"],
    "runs show": ["runs", "show", "1"],
    "compare": ["compare", "1", "2"],
    "gate": ["gate", "2", "--baseline", "1"],
    "bench": ["bench", "--pipeline", "minilm", "--size", "test", "--configs", "fp32"],
    "tune": ["tune", "--pipeline", "minilm", "--size", "test"],
}


def _no_configs(tmp: Path) -> Path:
    path = tmp / "s.sqlite"
    with Store(path) as store:
        for _ in range(2):
            store_run(store, [("fp32", [0.1, 0.1, 0.1], {"sqnr_db": float("inf")})])
    db = sqlite3.connect(path)
    db.execute("DROP TABLE configs")
    db.commit()
    db.close()
    return path


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "p.sqlite")
    return tmp / "p.sqlite"


def _folder(tmp: Path) -> Path:
    (tmp / "d.sqlite").mkdir()
    return tmp / "d.sqlite"


BROKEN = {
    "no configs table": (_no_configs, "claims schema version 4 but lacks table configs"),
    "fifo": (_fifo, "is a named pipe (FIFO)"),
    "directory": (_folder, "is a directory"),
    "missing folder": (lambda tmp: tmp / "nope" / "s.sqlite", "does not exist; mixprec creates no folder but its own"),
}


class TestCommandsOnBrokenStores:
    @pytest.mark.parametrize("command", sorted(COMMANDS))
    @pytest.mark.parametrize("kind", sorted(BROKEN))
    @pytest.mark.parametrize("via", ["--db", "MIXPREC_DB"])
    def test_refused_with_the_source_and_reason(self, command, kind, via, tmp_path, clean_env):
        make, reason = BROKEN[kind]
        path = make(tmp_path)
        before = sorted(p.name for p in tmp_path.rglob("*"))
        held = os.open(path, os.O_RDWR | os.O_NONBLOCK) if kind == "fifo" else None  # a wrong open reads, never blocks
        try:
            args = list(COMMANDS[command])
            if via == "--db":
                args += ["--db", str(path)]
            else:
                clean_env.setenv("MIXPREC_DB", str(path))
            result = runner.invoke(app, args)
        finally:
            if held is not None:
                os.close(held)
        flat = result.output.replace("\n", "")
        assert result.exit_code == 2, result.output
        assert isinstance(result.exception, SystemExit) and "Traceback" not in result.output
        assert flat.startswith(f"error: {via} '{path}'") and reason in flat, result.output
        assert sorted(p.name for p in tmp_path.rglob("*")) == before
