"""``--pipeline module.path:factory`` / ``path/to/file.py:factory`` through the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile
from typer.testing import CliRunner

from mixprec.bench.store import Store
from mixprec.cli import app

runner = CliRunner()

_FACTORY_FILE = '''
"""Two tiny pipelines a user keeps next to their app."""

import torch
from torch import nn

from mixprec.pipelines import EmbeddingOutput, Pipeline, wrap


class TinyEncoder(Pipeline):
    name = "tiny-encoder"
    output_kind = "embedding"
    sensitive = ("type:LayerNorm",)

    def __init__(self, width, seed=0):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = nn.Sequential(nn.Linear(8, width), nn.LayerNorm(width), nn.GELU(), nn.Linear(width, 4))
        super().__init__({"net": net})

    def _example_inputs(self, batch, seed):
        return torch.randn(batch, 8, generator=torch.Generator().manual_seed(seed))

    def _run(self, inputs):
        return EmbeddingOutput(output=self.components["net"](inputs).float())


def build(size="default", seed=0):
    if size not in ("default", "test"):
        raise ValueError(f"unknown size {size!r}; valid: default, test")
    return TinyEncoder(32 if size == "default" else 8, seed)


class Beeper:
    """An app object: no Pipeline, but modules, a sample rate and example inputs."""

    sr = 8000

    def __init__(self):
        self.synth = nn.Sequential(nn.Linear(2, 64), nn.Tanh())

    def example_inputs(self, batch, seed):
        return torch.randn(batch, 2, generator=torch.Generator().manual_seed(seed))

    def __call__(self, x):
        return self.synth(x)


def beeper():
    return Beeper()


def plain_sequential():
    return nn.Sequential(nn.Linear(8, 4))


def fails(size="default"):
    raise RuntimeError("checkpoint not found")


def returns_text():
    return "not a pipeline"
'''


@pytest.fixture
def project(tmp_path, clean_env):
    """A directory holding ``factories.py``, made the current directory."""
    (tmp_path / "factories.py").write_text(_FACTORY_FILE)
    (tmp_path / "needs_dep.py").write_text("import torch\nimport a_package_nobody_installed\n\n\ndef build():\n    pass\n")
    clean_env.chdir(tmp_path)
    return tmp_path


def test_explain_a_file_factory(project):
    result = runner.invoke(app, ["explain", "--pipeline", "factories.py:build", "--preset", "memory", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["module"]: r for r in json.loads(result.output)["modules"]}
    assert set(rows) == {"net.0", "net.1", "net.3"}
    assert rows["net.1"]["type"] == "LayerNorm"
    table = runner.invoke(app, ["explain", "--pipeline", "factories.py:build", "--preset", "memory", "--size", "test"])
    assert table.exit_code == 0, table.output
    assert "factories.py:build under memory" in table.output


def test_run_a_file_factory_and_a_wrapped_object(project):
    result = runner.invoke(app, ["run", "--pipeline", "factories.py:build", "--size", "test", "--out", "e.npy",
                                 "--batch", "2"])
    assert result.exit_code == 0, result.output
    assert np.load(project / "e.npy").shape == (2, 4)
    # an object that is not a Pipeline: wrapped, audio because of its `sr` attribute
    result = runner.invoke(app, ["run", "--pipeline", "factories.py:beeper", "--out", "beep.wav"])
    assert result.exit_code == 0, result.output
    wave, rate = soundfile.read(project / "beep.wav")
    assert rate == 8000 and wave.shape == (64,)


def test_diagnose_a_file_factory(project):
    result = runner.invoke(app, ["diagnose", "--pipeline", "factories.py:build", "--preset", "memory", "--json"])
    assert result.exit_code == 0, result.output
    assert {r["module"] for r in json.loads(result.output)["modules"]} >= {"net.0", "net.3"}


def test_module_factory_spec(project, monkeypatch):
    monkeypatch.syspath_prepend(str(project))
    result = runner.invoke(app, ["explain", "--pipeline", "factories:build", "--preset", "memory", "--json"])
    assert result.exit_code == 0, result.output


def test_bench_a_file_factory_in_worker_processes(project):
    db = project / "b.sqlite"
    result = runner.invoke(app, ["bench", "--pipeline", "factories.py:build", "--size", "test", "--configs", "fp32",
                                 "--repeat", "1", "--warmup", "0", "--db", str(db)])
    assert result.exit_code == 0, result.output
    run = Store(db).load_run(1)
    assert run["status"] == "complete"
    assert run["pipeline"] == f"{project / 'factories.py'}:build"  # sent to the workers as an absolute path
    (config,) = run["configs"]
    assert config["status"] == "ok", config["error"]
    assert len(config["samples"]) == 1 and config["metrics"]["weight_bytes"] > 0


@pytest.mark.parametrize(
    ("spec", "needles"),
    [
        ("missing.py:build", ["'missing.py:build'", "missing.py' does not exist"]),
        ("no_such_module_xyz:build", ["cannot import module 'no_such_module_xyz'",
                                      "ModuleNotFoundError: No module named 'no_such_module_xyz'"]),
        ("needs_dep.py:build", ["needs_dep.py' raised ModuleNotFoundError: No module named "
                                "'a_package_nobody_installed' (needs_dep.py line 2)"]),
        ("factories.py:biuld", ["has no attribute 'biuld'", "Did you mean 'build'"]),
        ("factories.py:fails", ["the factory raised RuntimeError: checkpoint not found"]),
        ("factories.py:returns_text", ["returned str ('not a pipeline')",
                                       "neither a mixprec.pipelines.Pipeline nor an object"]),
        ("factories.py:", ["no factory name after ':'"]),
    ],
)
def test_bad_factories_exit_2_with_the_reason(project, spec, needles):
    result = runner.invoke(app, ["explain", "--pipeline", spec, "--preset", "memory"])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())  # rich wraps long lines
    assert f"pipeline factory {spec!r}" in text
    for needle in needles:
        assert needle in text


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--out", "x.npy"],
        ["diagnose", "--preset", "memory"],
        ["bench", "--repeat", "1", "--warmup", "0", "--configs", "fp32"],
        ["tune", "--budget", "9"],
    ],
)
def test_every_command_reports_a_broken_factory_with_exit_2(project, args):
    result = runner.invoke(app, [args[0], "--pipeline", "factories.py:fails", *args[1:]])
    assert result.exit_code == 2, result.output
    assert "the factory raised RuntimeError: checkpoint not found" in " ".join(result.output.split())


def test_factory_without_example_inputs_says_what_to_add(project):
    result = runner.invoke(app, ["run", "--pipeline", "factories.py:plain_sequential", "--out", "x.npy"])
    assert result.exit_code == 2, result.output
    assert "example_inputs=" in " ".join(result.output.split())
    result = runner.invoke(app, ["bench", "--pipeline", "factories.py:plain_sequential", "--configs", "fp32"])
    assert result.exit_code == 2, result.output
    assert "has no example inputs" in " ".join(result.output.split())


def test_tune_worker_resolves_a_relative_file_factory(project):
    from mixprec.tuning.evaluators import WorkerEvaluator

    with WorkerEvaluator("factories.py:build", "test", seeds=(0,), repeat=1) as evaluator:
        assert evaluator.pipeline == f"{project / 'factories.py'}:build"
        assert evaluator.units() and evaluator.groups() == ["net"]
        assert evaluator.sensitive() == ["type:LayerNorm"]
