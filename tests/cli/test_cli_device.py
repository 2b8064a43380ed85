"""``--device`` on every command that runs a model: refused before any work where this machine
lacks the device, passed to the pipeline factory, and stored with the run."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from typer.testing import CliRunner

from mixprec.bench.store import Store
from mixprec.cli import app

runner = CliRunner()


@pytest.fixture
def no_cuda(monkeypatch):
    """This machine as torch sees one without CUDA (restored after the test)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def marker_factory(tmp_path):
    """A factory spec whose factory leaves a file behind when it is called (so a test can tell it never ran)."""
    marker = tmp_path / "factory-was-called"
    source = tmp_path / "marked.py"
    source.write_text(textwrap.dedent(f"""
        from pathlib import Path

        from mixprec import pipelines


        def build(*, size="default", seed=0, device="cpu"):
            Path({str(marker)!r}).write_text(str(device))
            return pipelines.get("minilm", size="test", seed=seed, device=device)
    """))
    return f"{source}:build", marker


def _said(result) -> str:
    return " ".join(result.output.split())


@pytest.mark.parametrize("command", [
    ["tune", "--bound", "cosine>=0.99"],
    ["bench", "--configs", "fp32"],
    ["run", "--out", "out.npy"],
    ["explain", "--preset", "fast"],
    ["diagnose", "--preset", "fast"],
])
def test_cuda_without_cuda_is_refused_before_any_work(tmp_path, monkeypatch, no_cuda, marker_factory, command):
    monkeypatch.chdir(tmp_path)
    spec, marker = marker_factory
    db = tmp_path / "store.sqlite"
    extra = ["--db", str(db)] if command[0] in ("tune", "bench") else []
    result = runner.invoke(app, [*command, "--pipeline", spec, "--size", "test", "--device", "cuda", *extra])
    assert result.exit_code == 2, result.output
    said = _said(result)
    assert "--device 'cuda': CUDA is not available on this machine" in said and "use cpu" in said
    assert not marker.exists(), "the factory was built before the device was checked"
    assert not db.exists() and not (tmp_path / "out.npy").exists()


def test_an_unknown_device_names_the_flag_and_the_choices(tmp_path):
    result = runner.invoke(app, ["tune", "--pipeline", "minilm", "--size", "test", "--device", "tpu",
                                 "--db", str(tmp_path / "s.sqlite")])
    assert result.exit_code == 2
    assert "--device 'tpu': unsupported device; choose cpu, cuda, cuda:N or mps" in _said(result)


def test_tune_on_cpu_builds_there_and_stores_the_device(tmp_path, marker_factory):
    spec, marker = marker_factory
    db = tmp_path / "tune.sqlite"
    result = runner.invoke(app, ["tune", "--pipeline", spec, "--size", "test", "--device", "cpu", "--bound", "cosine>=0.99",
                                 "--budget", "20", "--repeat", "1", "--seeds", "1", "--validation-seeds", "0",
                                 "--db", str(db), "--json"])
    assert result.exit_code == 0, result.output
    assert marker.read_text() == "cpu"  # the factory accepts device: it was given it
    assert json.loads(result.stdout[result.stdout.index("{"):])["device"] == "cpu"
    with Store(db) as store:
        [stored] = store.tune_runs()
        assert stored["device"] == "cpu"
        assert store.load_tune_run(stored["id"])["result"]["device"] == "cpu"


def test_run_and_explain_take_the_device(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ran = runner.invoke(app, ["run", "--pipeline", "minilm", "--size", "test", "--device", "cpu", "--out", "emb.npy"])
    assert ran.exit_code == 0, ran.output
    assert (tmp_path / "emb.npy").exists() and "device" in ran.output and "cpu" in ran.output
    explained = runner.invoke(app, ["explain", "--pipeline", "minilm", "--size", "test", "--device", "cpu",
                                    "--preset", "fast", "--json"])
    assert explained.exit_code == 0, explained.output
    assert json.loads(explained.stdout)["device"] == "cpu"
    table = runner.invoke(app, ["explain", "--pipeline", "minilm", "--size", "test", "--device", "cpu", "--preset", "fast"])
    assert table.exit_code == 0 and "minilm under fast on cpu" in table.output


def test_diagnose_saves_the_device_with_its_run(tmp_path):
    db = tmp_path / "d.sqlite"
    result = runner.invoke(app, ["diagnose", "--pipeline", "minilm", "--size", "test", "--device", "cpu", "--preset", "fast",
                                 "--save", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert "minilm under fast on cpu" in result.output
    with Store(db) as store:
        [listed] = store.runs()
        assert listed["device"] == "cpu" and store.load_run(listed["id"])["machine"]["device"] == "cpu"
