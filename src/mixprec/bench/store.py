"""The benchmark store: SQLite (stdlib ``sqlite3``), versioned schema, WAL mode.

Every run records the hardware and its fingerprint, torch and mixprec versions, the
pipeline, each configuration's full policy JSON, every raw timing sample and every
metric. A run is written as it goes and marked ``complete`` only at the end, so an
interrupted run keeps what it measured and reads as ``incomplete``.

The file is refused, never overwritten, when it is not SQLite, when it is another
application's database, or when its schema is newer than this mixprec knows.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from mixprec._quote import few
from mixprec.bench.store_checks import StoreError, check_location, default_store_folder, schema_problems, shown_path

__all__ = ["Store", "StoreError", "SCHEMA_VERSION", "default_db_path"]

APP_ID = "mixprec-bench"

# Each migration takes the schema from version i to i + 1.
MIGRATIONS: tuple[str, ...] = (
    # 1: runs, configurations, samples, metrics
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        started TEXT NOT NULL,
        finished TEXT,
        status TEXT NOT NULL,
        pipeline TEXT NOT NULL,
        machine_json TEXT NOT NULL,
        machine_fingerprint TEXT NOT NULL,
        versions_json TEXT NOT NULL,
        notes_json TEXT NOT NULL DEFAULT '[]'
    );
    CREATE TABLE configs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        name TEXT NOT NULL,
        batch INTEGER NOT NULL,
        status TEXT NOT NULL,
        error TEXT,
        policy_json TEXT
    );
    CREATE TABLE samples (
        config_id INTEGER NOT NULL REFERENCES configs(id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        seconds REAL NOT NULL,
        PRIMARY KEY (config_id, idx)
    );
    CREATE TABLE metrics (
        config_id INTEGER NOT NULL REFERENCES configs(id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        value REAL,
        PRIMARY KEY (config_id, name)
    );
    """,
    # 2: the run's size and command line; per-module profile rows (mixprec diagnose)
    """
    ALTER TABLE runs ADD COLUMN size TEXT NOT NULL DEFAULT 'default';
    ALTER TABLE runs ADD COLUMN command TEXT NOT NULL DEFAULT '';
    CREATE TABLE profile_rows (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        config TEXT NOT NULL,
        module TEXT NOT NULL,
        data_json TEXT NOT NULL
    );
    """,
    # 3: autotuner measurements (reused across tune runs) and tune runs
    """
    CREATE TABLE tune_evals (
        key TEXT PRIMARY KEY,
        target TEXT NOT NULL,
        policy_json TEXT NOT NULL,
        latency REAL NOT NULL,
        memory REAL NOT NULL,
        quality_json TEXT NOT NULL,
        created TEXT NOT NULL
    );
    CREATE TABLE tune_runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        started TEXT NOT NULL,
        pipeline TEXT NOT NULL,
        bound TEXT NOT NULL,
        objective TEXT NOT NULL,
        met INTEGER NOT NULL,
        evaluations INTEGER NOT NULL,
        cached INTEGER NOT NULL,
        wall_s REAL NOT NULL,
        policy_toml TEXT NOT NULL,
        result_json TEXT NOT NULL
    );
    """,
    # 4: each autotuner measurement's quality per seed (the spread a tune run reports)
    """
    ALTER TABLE tune_evals ADD COLUMN per_seed_json TEXT NOT NULL DEFAULT '{}';
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def default_db_path() -> Path:
    """``MIXPREC_DB`` or ``bench.sqlite`` in the user data dir."""
    override = os.environ.get("MIXPREC_DB")
    if override:
        return Path(override)
    return default_store_folder() / "bench.sqlite"


#: SQLite's own wait on a busy database before _begin takes over (and can say so).
_BUSY_S = 2.0


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _write_problem(exc: sqlite3.OperationalError) -> str | None:
    """What a failed write says about the disk, or ``None`` for other errors.

    A full disk reads "database or disk is full", or in WAL mode often "disk I/O error";
    a read-only file or file system reads "attempt to write a readonly database".
    """
    text = str(exc).lower()
    if "full" in text:
        return "the disk is full"
    if "disk i/o error" in text:
        return "the disk is full or failing"
    if "readonly" in text or "read-only" in text:
        return "the file or its file system is read-only"
    return None


def _warn(message: str) -> None:
    import warnings

    warnings.warn(message, stacklevel=4)


def _text(value: Any) -> Any:
    """Text SQLite can keep: a name decoded from bytes that are not UTF-8 (a file name's lone
    surrogates) is kept with those characters as ``\\udcXX`` escapes instead of failing the write."""
    if not isinstance(value, str):
        return value
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def _num(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value


class Store:
    """A benchmark database. Open with ``Store(path)``; every method is one transaction.

    A write that finds the database held by another process waits for it, up to
    ``lock_wait_s`` seconds, and tells ``on_wait`` once (default: a warning); only then
    does it fail with :class:`StoreError`.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, target_version: int = SCHEMA_VERSION,
                 lock_wait_s: float = 600.0, on_wait: Callable[[str], None] | None = None, source: str | None = None):
        """Open (or create) the store at ``path`` (default: :func:`default_db_path`).

        ``source`` names where the path came from in messages (``--db``, a store box); by default
        ``MIXPREC_DB`` or ``the default store`` when ``path`` is ``None``, else ``store path``.
        The file is checked before it is opened (:mod:`mixprec.bench.store_checks`): a directory,
        FIFO or device, a missing folder other than mixprec's own data folder, or a store lacking
        a table or column of its schema version is refused with a :class:`StoreError`.
        """
        if source is None:
            source = ("MIXPREC_DB" if os.environ.get("MIXPREC_DB") else "the default store") if path is None \
                else "store path"
        self.path = Path(path) if path is not None else default_db_path()
        self.source = source
        self.lock_wait_s = float(lock_wait_s)
        self.on_wait = on_wait if on_wait is not None else _warn
        check_location(self.path, source)
        self._check_file()
        busy_s = max(0.05, min(_BUSY_S, self.lock_wait_s))
        self._conn = sqlite3.connect(self.path, timeout=busy_s, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_s * 1000)}")
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._migrate(target_version)
            self._conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            if isinstance(exc, sqlite3.OperationalError) and _is_locked(exc):
                raise StoreError(f"{self.path} is locked by another process ({exc}); it was left untouched. "
                                 "Run again when the other process has finished, or choose another --db") from None
            if isinstance(exc, sqlite3.OperationalError) and (problem := _write_problem(exc)):
                raise StoreError(f"{self.path}: cannot write ({exc}): {problem}. "
                                 "Free some space or choose another --db, and run again") from None
            raise StoreError(f"{self.path} is not a usable SQLite database ({exc}); it was left untouched") from None
        except StoreError:
            self._conn.close()
            raise

    def _check_file(self) -> None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb") as fh:
            header = fh.read(16)
        if header != b"SQLite format 3\x00":
            raise StoreError(f"{self.path} is not a SQLite database; refusing to use or overwrite it (choose another --db)")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        try:
            self._begin()  # inside: an interrupt (Ctrl-C) just after BEGIN still rolls it back
            yield self._conn
            self._conn.execute("COMMIT")
        except BaseException as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError) and (problem := _write_problem(exc)):
                raise StoreError(f"{self.path}: cannot write ({exc}): {problem}; what was stored before is kept. "
                                 "Free some space or choose another --db, and run again") from None
            raise

    def _begin(self) -> None:
        """Start a write transaction; while another process holds the database, wait (saying so once)."""
        started, told = time.monotonic(), False
        while True:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not _is_locked(exc):
                    if problem := _write_problem(exc):
                        raise StoreError(f"{self.path}: cannot write ({exc}): {problem}; what was stored before is "
                                         "kept. Free some space or choose another --db, and run again") from None
                    raise
                waited = time.monotonic() - started
                if waited >= self.lock_wait_s:
                    raise StoreError(f"{self.path} stayed locked by another process for {waited:.0f} s; "
                                     "nothing was written. Run again when the other process has finished, "
                                     "or choose another --db") from None
                if not told:
                    told = True
                    self.on_wait(f"{self.path} is in use by another process (a benchmark or tune writing to it); "
                                 f"waiting up to {self.lock_wait_s:.0f} s for it")
                time.sleep(min(0.2, self.lock_wait_s))

    def _migrate(self, target: int) -> None:
        with self._tx() as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if tables and "meta" not in tables:
                raise StoreError(f"{self.path} is another application's database (tables: {', '.join(sorted(tables))}); "
                                 "refusing to use or overwrite it")
            version = 0
            if "meta" in tables:
                if lacking := schema_problems(db, MIGRATIONS[:1], 1, only=("meta",)):
                    raise self._damaged("an app and schema version", lacking)
                meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
                if meta.get("app") != APP_ID:
                    raise StoreError(f"{self.path} is not a mixprec benchmark database; refusing to use or overwrite it")
                version = _schema_version(meta.get("schema_version"))
                if version is None:
                    raise self._damaged(f"schema version {shown_path(str(meta.get('schema_version')))} (not a whole "
                                        f"number from 1 to {SCHEMA_VERSION})", [])
            if version > SCHEMA_VERSION:
                raise StoreError(f"{self.path} has schema version {version}, newer than this mixprec ({SCHEMA_VERSION}); upgrade mixprec")
            if version and (lacking := schema_problems(db, MIGRATIONS, version)):
                raise self._damaged(f"schema version {version}", lacking)
            for index in range(version, target):
                for statement in MIGRATIONS[index].split(";"):
                    if statement.strip():
                        db.execute(statement)
            if version < target:
                db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('app', ?)", (APP_ID,))
                db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)", (str(target),))

    def _damaged(self, claim: str, lacking: list[str]) -> StoreError:
        what = f" but lacks {few(lacking, listed=8)}" if lacking else ""
        return StoreError(f"{self.source} {shown_path(self.path)}: a mixprec store that claims {claim}{what}: it was "
                          "damaged or changed by another program, and was left untouched. Move it aside to start a new "
                          "store there (mixprec creates one where none exists), or choose another path")

    @property
    def schema_version(self) -> int:
        return int(self._conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- writing -----------------------------------------------------------------------
    def start_run(self, *, pipeline: str, size: str, machine: dict[str, Any], fingerprint: str,
                  versions: dict[str, Any], notes: list[str], command: str = "") -> int:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO runs(started, status, pipeline, size, machine_json, machine_fingerprint, versions_json, notes_json, command) "
                "VALUES (?, 'incomplete', ?, ?, ?, ?, ?, ?, ?)",
                (_now(), _text(pipeline), _text(size), json.dumps(machine), fingerprint, json.dumps(versions), json.dumps(notes),
                 _text(command)))
            return int(cur.lastrowid)

    def add_config(self, run_id: int, *, position: int, name: str, batch: int, status: str = "running",
                   policy: dict[str, Any] | None = None, error: str | None = None) -> int:
        with self._tx() as db:
            cur = db.execute("INSERT INTO configs(run_id, position, name, batch, status, error, policy_json) VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (run_id, position, _text(name), batch, status, _text(error),
                              json.dumps(policy) if policy is not None else None))
            return int(cur.lastrowid)

    def add_sample(self, config_id: int, index: int, seconds: float) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO samples(config_id, idx, seconds) VALUES (?, ?, ?)", (config_id, index, seconds))

    def finish_config(self, config_id: int, *, status: str, metrics: dict[str, Any], error: str | None = None,
                      policy: dict[str, Any] | None = None) -> None:
        """Store a configuration's status and metrics. A ``None`` metric (not measured) is
        not stored; a NaN is stored as NULL (SQLite keeps no NaN), so a metric row without
        a value was measured as NaN."""
        with self._tx() as db:
            db.execute("UPDATE configs SET status=?, error=?, policy_json=COALESCE(?, policy_json) WHERE id=?",
                       (status, _text(error), json.dumps(policy) if policy is not None else None, config_id))
            db.executemany("INSERT OR REPLACE INTO metrics(config_id, name, value) VALUES (?, ?, ?)",
                           [(config_id, k, _num(v)) for k, v in metrics.items() if isinstance(v, (int, float))])

    def finish_run(self, run_id: int, *, status: str = "complete", notes: list[str] | None = None,
                   size: str | None = None) -> None:
        """Mark run ``run_id`` finished with ``status``. A run that did not run to its end (cancelled,
        interrupted, failed) leaves no configuration ``running``: one the run stopped before its
        worker reported anything (a Ctrl-C as it started) is ``partial``, stopped before it was measured."""
        with self._tx() as db:
            db.execute("UPDATE runs SET finished=?, status=? WHERE id=?", (_now(), status, run_id))
            if status != "complete":
                db.execute("UPDATE configs SET status='partial', error=coalesce(error, 'stopped before it was measured') "
                           "WHERE run_id=? AND status='running'", (run_id,))
            if size is not None:
                db.execute("UPDATE runs SET size=? WHERE id=?", (_text(size), run_id))
            if notes is not None:
                db.execute("UPDATE runs SET notes_json=? WHERE id=?", (json.dumps(notes), run_id))

    def add_profile_rows(self, run_id: int, config: str, rows: list[dict[str, Any]]) -> None:
        with self._tx() as db:
            db.executemany("INSERT INTO profile_rows(run_id, config, module, data_json) VALUES (?, ?, ?, ?)",
                           [(run_id, _text(config), _text(r["module"]), json.dumps(r)) for r in rows])

    def put_tune_eval(self, key: str, *, target: str, policy: dict[str, Any], latency: float, memory: float,
                      quality: dict[str, float], per_seed: dict[int, dict[str, float]] | None = None) -> None:
        """Keep one autotuner measurement under ``key`` (target, seeds, machine and policy hashed)."""
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO tune_evals (key, target, policy_json, latency, memory, quality_json, "
                       "created, per_seed_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (key, target, json.dumps(policy, sort_keys=True), latency, memory, json.dumps(quality), _now(),
                        json.dumps({str(k): v for k, v in (per_seed or {}).items()})))

    def get_tune_eval(self, key: str) -> dict[str, Any] | None:
        """An earlier autotuner measurement: ``latency``, ``memory``, ``quality`` and ``per_seed``, or ``None``."""
        row = self._conn.execute("SELECT latency, memory, quality_json, per_seed_json FROM tune_evals WHERE key=?",
                                 (key,)).fetchone()
        if row is None:
            return None
        per_seed = {int(k): v for k, v in json.loads(row[3]).items()}
        return {"latency": row[0], "memory": row[1], "quality": json.loads(row[2]), "per_seed": per_seed}

    def add_tune_run(self, *, pipeline: str, bound: str, objective: str, met: bool, evaluations: int, cached: int,
                     wall_s: float, policy_toml: str, result: dict[str, Any]) -> int:
        """Keep a finished tune run (chosen policy, frontier and path in ``result``); returns its id."""
        with self._tx() as db:
            cur = db.execute("INSERT INTO tune_runs(started, pipeline, bound, objective, met, evaluations, cached, wall_s, "
                             "policy_toml, result_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (_now(), pipeline, bound, objective, int(met), evaluations, cached, wall_s, policy_toml,
                              json.dumps(result)))
            return int(cur.lastrowid)

    def tune_runs(self, limit: int = 50) -> list[dict[str, Any]]:
        """Recent tune runs, newest first (without their results); ``device`` is where each was measured
        (kept in its result; ``None`` for runs stored before it was); ``status``: ``complete``, ``cancelled``
        (stopped on request) or ``incomplete`` (interrupted: Ctrl-C), ``complete`` for runs stored before it was."""
        rows = self._conn.execute("SELECT id, started, pipeline, bound, objective, met, evaluations, cached, wall_s, "
                                  "json_extract(result_json, '$.device') AS device, "
                                  "coalesce(json_extract(result_json, '$.status'), 'complete') AS status "
                                  "FROM tune_runs ORDER BY id DESC LIMIT ?", (limit,))
        return [dict(r) for r in rows]

    def load_tune_run(self, run_id: int) -> dict[str, Any]:
        """One tune run with its ``policy_toml`` and ``result``."""
        _check_id(run_id, "tune run")
        row = self._conn.execute("SELECT * FROM tune_runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            known = [r["id"] for r in self.tune_runs(10)]
            raise StoreError(f"no tune run {run_id} in {self.path}; recent tune runs: {', '.join(map(str, known)) or 'none'}")
        out = dict(row)
        out["result"] = json.loads(out.pop("result_json"))
        return out

    # -- reading -----------------------------------------------------------------------
    def runs(self, limit: int = 50) -> list[dict[str, Any]]:
        """Recent runs, newest first, with the device each was measured on (its probed device type for runs
        stored before the device was)."""
        rows = self._conn.execute(
            "SELECT r.id, r.started, r.finished, r.status, r.pipeline, r.size, "
            "COALESCE(json_extract(r.machine_json, '$.device'), json_extract(r.machine_json, '$.device_type')) AS device, "
            "(SELECT COUNT(*) FROM configs c WHERE c.run_id = r.id) AS configs FROM runs r ORDER BY r.id DESC LIMIT ?", (limit,))
        return [dict(r) for r in rows]

    def load_run(self, run_id: int) -> dict[str, Any]:
        """The run as a plain dict (the shape :mod:`mixprec.bench.report` renders).

        Each configuration has its ``samples`` (seconds) and their ``rounds`` (the timed
        round of each, for pairing with the reference's), and its ``metrics``, where a
        metric measured as NaN reads ``None`` (see :meth:`finish_config`).
        """
        _check_id(run_id, "run")
        row = self._conn.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            known = [r["id"] for r in self.runs(10)]
            raise StoreError(f"no run {run_id} in {self.path}; recent runs: {', '.join(map(str, known)) or 'none'}")
        configs = []
        for c in self._conn.execute("SELECT * FROM configs WHERE run_id=? ORDER BY batch, position", (run_id,)):
            timed = self._conn.execute("SELECT idx, seconds FROM samples WHERE config_id=? ORDER BY idx", (c["id"],)).fetchall()
            samples, rounds = [r[1] for r in timed], [r[0] for r in timed]
            metrics = {r[0]: (r[1] if r[1] is not None else None) for r in
                       self._conn.execute("SELECT name, value FROM metrics WHERE config_id=?", (c["id"],))}
            configs.append({"name": c["name"], "batch": c["batch"], "status": c["status"], "error": c["error"],
                            "policy": json.loads(c["policy_json"]) if c["policy_json"] else None,
                            "samples": samples, "rounds": rounds, "metrics": metrics})
        return {"id": row["id"], "started": row["started"], "finished": row["finished"], "status": row["status"],
                "pipeline": row["pipeline"], "size": row["size"], "command": row["command"],
                "machine": json.loads(row["machine_json"]), "machine_fingerprint": row["machine_fingerprint"],
                "versions": json.loads(row["versions_json"]), "notes": json.loads(row["notes_json"]), "configs": configs}


def _schema_version(value: Any) -> int | None:
    """The meta table's ``schema_version`` as a whole number >= 1, or ``None`` when it is anything else."""
    text = str(value).strip() if value is not None else ""
    return int(text) if text.isascii() and text.isdigit() and int(text) >= 1 else None


#: The largest id SQLite keeps (a signed 64-bit integer).
MAX_ID = 2**63 - 1


def _check_id(run_id: Any, what: str) -> None:
    if isinstance(run_id, bool) or not isinstance(run_id, int) or not 1 <= run_id <= MAX_ID:
        raise StoreError(f"{what} id {run_id!r} is not valid: ids are whole numbers from 1 to {MAX_ID}")


def finite_or_none(value: Any) -> Any:
    """JSON-friendly metric values (infinities as strings)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
