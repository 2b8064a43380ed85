"""Files the CLI writes: atomic where they replace, a clear error (path, reason, how to write again) when they cannot be written."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mixprec.bench.store import Store
from mixprec.cli import app
from mixprec.cli._files import describe_os_error, write_atomic
from tiny_factory import tiny_factory_source

runner = CliRunner()
DEV_FULL = "/dev/full"  # every write fails with ENOSPC: a full disk
needs_dev_full = pytest.mark.skipif(not os.path.exists(DEV_FULL), reason="needs /dev/full (Linux)")

_FACTORY = tiny_factory_source('nn.GELU()')


@pytest.fixture
def project(tmp_path, clean_env):
    (tmp_path / "f.py").write_text(_FACTORY)
    clean_env.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def stored_run(project):
    db = project / "b.sqlite"
    with Store(db) as store:
        run_id = store.start_run(pipeline="tiny", size="test", machine={"name": "m"}, fingerprint="f", versions={},
                                 notes=[], command="mixprec bench")
        config_id = store.add_config(run_id, position=0, name="fp32", batch=1)
        store.add_sample(config_id, 0, 0.01)
        store.finish_config(config_id, status="ok", metrics={"latency_median": 0.01})
        store.finish_run(run_id)
    return db


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path):
    target = tmp_path / "report.html"
    target.write_text("the old report")
    os.chmod(target, 0o640)

    def half_then_fail(path: Path) -> None:
        path.write_text("half a new rep")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_atomic(target, half_then_fail)
    assert target.read_text() == "the old report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # no temporary file left
    write_atomic(target, lambda p: p.write_text("new"))
    assert target.read_text() == "new" and (target.stat().st_mode & 0o777) == 0o640  # replaced, mode kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_write_atomic_keeps_the_suffix_for_writers_that_choose_a_format_by_it(tmp_path):
    seen = []
    write_atomic(tmp_path / "out.wav", lambda p: (seen.append(p.suffix), p.write_bytes(b"x")))
    assert seen == [".wav"] and (tmp_path / "out.wav").read_bytes() == b"x"


def test_reasons_are_named():
    assert describe_os_error(OSError(28, "No space left on device")) == "the disk is full (No space left on device)"
    assert describe_os_error(OSError(30, "Read-only file system")).startswith("the file system is read-only")
    assert describe_os_error(FileNotFoundError(2, "No such file or directory")).startswith("the directory does not exist")


def test_runs_show_html_into_a_missing_directory_is_refused_before_work(stored_run):
    result = runner.invoke(app, ["runs", "show", "1", "--db", str(stored_run), "--html", "/nonexistent/dir/x.html"])
    assert result.exit_code == 2
    assert "--html '/nonexistent/dir/x.html'" in result.output and "does not exist" in result.output
    assert "Traceback" not in result.output and "run 1" not in result.output


@needs_dev_full
@pytest.mark.parametrize("flag", ["--html", "--csv"])
def test_runs_show_on_a_full_disk_prints_the_run_and_says_how_to_write_again(stored_run, flag):
    result = runner.invoke(app, ["runs", "show", "1", "--db", str(stored_run), flag, DEV_FULL])
    assert result.exit_code == 1, result.output
    assert "run 1: tiny" in result.output  # the table was printed
    assert f"{flag} '/dev/full' was not written: the disk is full" in result.output
    assert f"to write it again: mixprec runs show 1 {flag} /dev/full" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("run_id", ["0", "99999999999999999999", "-5"])
def test_run_ids_out_of_range(stored_run, run_id):
    for args in (["runs", "show", run_id], ["compare", "1", run_id], ["gate", "1", "--baseline", run_id]):
        result = runner.invoke(app, [*args, "--db", str(stored_run)])
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)


@needs_dev_full
@pytest.mark.parametrize("flag", ["--html", "--json", "--csv"])
def test_bench_on_a_full_disk_keeps_the_run(project, flag):
    result = runner.invoke(app, ["bench", "--pipeline", "f.py:build", "--size", "test", "--configs", "fp32", "--repeat", "1",
                                 "--warmup", "0", "--db", "b.sqlite", flag, DEV_FULL])
    assert result.exit_code == 1, result.output
    assert f"{flag} '/dev/full' was not written: the disk is full" in result.output
    assert "stored as run(s) 1 in b.sqlite" in result.output
    again = "mixprec runs show 1 --json > /dev/full" if flag == "--json" else f"mixprec runs show 1 {flag} /dev/full"
    assert again in result.output
    assert Store(project / "b.sqlite").load_run(1)["status"] == "complete"


def test_bench_writes_every_report(project):
    result = runner.invoke(app, ["bench", "--pipeline", "f.py:build", "--size", "test", "--configs", "fp32", "--repeat", "1",
                                 "--warmup", "0", "--db", "b.sqlite", "--html", "r.html", "--json", "r.json", "--csv", "r.csv"])
    assert result.exit_code == 0, result.output
    assert "<html" in (project / "r.html").read_text() and (project / "r.json").read_text().startswith("[")
    assert (project / "r.csv").read_text().startswith("run_id,")
    assert sorted(p.name for p in project.iterdir() if p.name.startswith(".")) == []  # no temporary files


@needs_dev_full
def test_tune_out_on_a_full_disk_prints_the_policy(project):
    result = runner.invoke(app, ["tune", "--pipeline", "f.py:build", "--size", "test", "--budget", "8", "--seeds", "1",
                                 "--repeat", "1", "--validation-seeds", "0", "--db", "t.sqlite", "--out", DEV_FULL])
    assert result.exit_code == 1, result.output
    assert "--out '/dev/full' was not written: the disk is full" in result.output
    assert "to write it again: run the same mixprec tune command" in result.output
    assert "the chosen policy, to save by hand:" in result.output and "[[rules]]" in result.output


def _limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))


def test_run_out_when_the_file_cannot_grow(project):
    result = subprocess.run([str(Path(sys.executable).parent / "mixprec"), "run", "--pipeline", "f.py:build", "--size", "test",
                             "--out", "e.npy"], cwd=project, preexec_fn=_limit_file_size, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1, result.stderr
    assert "--out 'e.npy' was not written: the file is larger than this system allows" in result.stderr
    # the command to repeat names the device the run resolved (cpu here, or a GPU where there is one)
    assert re.search(r"to write it again: mixprec run --pipeline f\.py:build --device \S+ --out e\.npy", result.stderr)
    assert "Traceback" not in result.stderr
    assert not (project / "e.npy").exists()
    assert [p.name for p in project.iterdir() if p.name.startswith(".")] == []


def test_run_out_replaces_an_existing_file(project):
    (project / "e.npy").write_bytes(b"old")
    result = runner.invoke(app, ["run", "--pipeline", "f.py:build", "--size", "test", "--out", "e.npy"])
    assert result.exit_code == 0, result.output
    import numpy as np

    assert np.load(project / "e.npy").shape == (1, 4)
    assert "e.npy" in result.output and ".part" not in result.output


def _limit_store_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (80_000, 80_000))  # the store fills up after a few samples


def test_bench_when_the_store_fills_up(project):
    result = subprocess.run([str(Path(sys.executable).parent / "mixprec"), "bench", "--pipeline", "f.py:build", "--size",
                             "test", "--configs", "fp32", "--repeat", "300", "--warmup", "0", "--db", "full.sqlite"],
                            cwd=project, preexec_fn=_limit_store_size, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "error: full.sqlite: cannot write" in result.stderr and "the disk is full" in result.stderr
    assert "what was stored before is kept" in result.stderr
    assert "Traceback" not in result.stderr
    runs = Store(project / "full.sqlite").runs()
    assert len(runs) == 1  # the run started before the disk filled is there (not complete)
