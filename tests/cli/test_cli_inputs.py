"""Every CLI input is checked before work: ranges, factories that exit or raise, a model that raises under diagnose."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from mixprec.cli import app

runner = CliRunner()

_FACTORIES = '''
import sys

import torch
from torch import nn
from mixprec.pipelines import EmbeddingOutput, Pipeline


class Net(nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.mode = mode

    def forward(self, x):
        if self.mode == "always":
            raise RuntimeError("weights file is corrupt")
        if self.mode == "fp32-only" and self.lin.weight.dtype != torch.float32:
            raise RuntimeError("this model only runs with fp32 weights")
        return self.lin(x)


class Tiny(Pipeline):
    name = "tiny"
    output_kind = "embedding"

    def __init__(self, mode="ok", inputs_fail=False):
        super().__init__({"net": Net(mode)})
        self.inputs_fail = inputs_fail

    def _example_inputs(self, batch, seed):
        if self.inputs_fail:
            raise KeyError("sample.wav")
        return torch.randn(batch, 8, generator=torch.Generator().manual_seed(seed))

    def _run(self, inputs):
        return EmbeddingOutput(output=self.components["net"](inputs).float())


def ok(size="default", seed=0):
    return Tiny()


def raises(size="default", seed=0):
    return Tiny("always")


def fp32_only(size="default", seed=0):
    return Tiny("fp32-only")


def bad_inputs(size="default", seed=0):
    return Tiny(inputs_fail=True)


def exits(size="default", seed=0):
    sys.exit(3)
'''


@pytest.fixture
def project(tmp_path, clean_env):
    (tmp_path / "f.py").write_text(_FACTORIES)
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n\ndef build():\n    pass\n")
    clean_env.chdir(tmp_path)
    return tmp_path


def _clean_exit(result, code=2):
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("args", "needle"), [
    (["bench", "--pipeline", "f.py:ok", "--batch", "99999999999999999999"], "--batch '99999999999999999999': expected an integer at most 2,147,483,647"),
    (["bench", "--pipeline", "f.py:ok", "--batch", "1000000000000", "--force-batch"], "at most 2,147,483,647"),
    (["bench", "--pipeline", "f.py:ok", "--seed", "99999999999999999999"], "--seed '99999999999999999999': expected an integer from 0"),
    (["bench", "--pipeline", "f.py:ok", "--repeat", "10000000000"], "--repeat '10000000000': expected an integer at most 100,000"),
    (["run", "--pipeline", "f.py:ok", "--out", "x.npy", "--batch", "99999999999999999999"], "at most 2,147,483,647"),
    (["run", "--pipeline", "f.py:ok", "--out", "x.npy", "--seed", "-1"], "--seed '-1': expected an integer from 0"),
    (["diagnose", "--pipeline", "f.py:ok", "--preset", "memory", "--top", "-3"], "--top -3: expected a number of rows >= 0"),
    (["diagnose", "--pipeline", "f.py:ok", "--preset", "memory", "--seed", "1e400"], "--seed '1e400': expected an integer"),
    (["tune", "--pipeline", "f.py:ok", "--seeds", "99999999"], "--seeds '99999999': at most 1000 seeds"),
    (["tune", "--pipeline", "f.py:ok", "--repeat", "99999999999999999999"], "at most 100,000"),
    (["ui", "--port", "70000"], "--port 70000: expected a TCP port from 1 to 65535"),
    (["ui", "--port", "0"], "--port 0: expected a TCP port from 1 to 65535"),
])
def test_out_of_range_values_are_refused_before_work(project, args, needle):
    result = runner.invoke(app, args)
    _clean_exit(result)
    assert needle in result.output


@pytest.mark.parametrize("command", [["bench", "--configs", "fp32", "--db", "b.sqlite"], ["explain", "--preset", "memory"],
                                     ["diagnose", "--preset", "memory"], ["run", "--out", "x.npy"]])
def test_a_factory_that_exits_at_import_is_an_error(project, command):
    result = runner.invoke(app, [command[0], "--pipeline", "exits_on_import.py:build", *command[1:]])
    _clean_exit(result)
    assert "called sys.exit(0)" in result.output and 'if __name__ == "__main__":' in result.output
    assert not (project / "b.sqlite").exists()


def test_a_factory_function_that_exits_is_an_error(project):
    result = runner.invoke(app, ["bench", "--pipeline", "f.py:exits", "--configs", "fp32", "--db", "b.sqlite"])
    _clean_exit(result)
    assert "the factory called sys.exit(3)" in result.output


@pytest.mark.parametrize("command", [["bench", "--configs", "fp32", "--db", "b.sqlite"], ["diagnose", "--preset", "memory"],
                                     ["run", "--out", "x.npy"], ["tune", "--db", "b.sqlite"]])
def test_example_inputs_that_raise_are_named(project, command):
    result = runner.invoke(app, [command[0], "--pipeline", "f.py:bad_inputs", *command[1:]])
    _clean_exit(result)
    assert "example_inputs(batch=1, seed=0) raised KeyError: 'sample.wav'" in result.output or \
        "raised KeyError: 'sample.wav'" in result.output
    assert not (project / "x.npy").exists()


def test_diagnose_reports_the_models_own_error(project):
    result = runner.invoke(app, ["diagnose", "--pipeline", "f.py:raises", "--preset", "memory"])
    _clean_exit(result)
    assert "the model raised RuntimeError: weights file is corrupt" in result.output
    assert "model's own error" in result.output.replace("\n", " ")


def test_diagnose_tells_an_error_the_policy_causes(project, bf16_cpu):
    """memory stores this model's weights in bf16 on a CPU with native bf16: the model refuses them."""
    result = runner.invoke(app, ["diagnose", "--pipeline", "f.py:fp32_only", "--preset", "memory"])
    _clean_exit(result)
    flat = result.output.replace("\n", " ")
    assert "this model only runs with fp32 weights" in flat and "the policy causes it" in flat


def test_run_reports_a_pipeline_that_raises_without_writing(project):
    result = runner.invoke(app, ["run", "--pipeline", "f.py:raises", "--out", "x.npy"])
    _clean_exit(result)
    assert "raised RuntimeError: weights file is corrupt" in result.output
    assert not (project / "x.npy").exists() and not [p for p in project.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("args", [["--preset", ""], ["--preset", "  "], ["--policy", ""]])
def test_an_empty_preset_or_policy_is_named(project, args):
    result = runner.invoke(app, ["explain", "--pipeline", "f.py:ok", *args])
    _clean_exit(result)
    assert f"{args[0]} {args[1]!r}: give a" in result.output


def test_an_output_name_too_long_for_the_file_system(project):
    result = runner.invoke(app, ["run", "--pipeline", "f.py:ok", "--out", "x" * 5000 + ".npy"])
    _clean_exit(result)
    assert "cannot be used as a file name (File name too long)" in result.output
    assert len(result.output) < 500  # the 5000-character name is not echoed whole
