"""The exit status a script reads from ``mixprec bench``: 0 where the run measured something usable,
1 (with one line saying why) where it measured nothing, its fp32 reference failed, or nothing was
timed. The run is judged by its stored rows (:func:`mixprec.bench.runstate.classify`)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import mixprec.bench.runner as bench_runner
from mixprec.cli import app
from run_states import write_run

runner = CliRunner()

EXIT = {"complete": 0, "partly measured": 0, "older record": 0,
        "nothing measured": 1, "reference failed": 1, "no timed rounds": 1}


@pytest.mark.parametrize("state", sorted(EXIT))
def test_bench_exits_non_zero_when_nothing_usable_was_measured(state, tmp_path, monkeypatch, clean_env):
    # The runner stores a run in this state, as a real one would after its workers ran.
    monkeypatch.setattr(bench_runner, "run_bench", lambda options, hw, store, progress=None: write_run(store, state))
    db = tmp_path / "runs.sqlite"
    result = runner.invoke(app, ["bench", "--pipeline", "minilm", "--size", "test", "--configs", "fp32,naive-bf16",
                                 "--db", str(db)])
    assert result.exit_code == EXIT[state], result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("not measured:")]
    if EXIT[state]:
        assert lines == [f"not measured: run 1 (tts) {state} (exit status 1)"], result.stderr
    else:
        assert lines == []


def test_a_tune_whose_fp32_reference_fails_says_so_in_one_line_and_exits_non_zero(tmp_path, clean_env):
    """The reference runs before any candidate: a model that fails in fp32 leaves nothing to measure."""
    factory = tmp_path / "broken.py"
    factory.write_text(
        "import torch\n\n\n"
        "class Broken(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.proj = torch.nn.Linear(4, 4)\n\n"
        "    def forward(self, x):\n"
        "        raise RuntimeError('this model cannot run')\n\n\n"
        "def pipeline():\n"
        "    import mixprec\n"
        "    return mixprec.pipelines.wrap(Broken(), example_inputs=lambda batch, seed: (torch.randn(batch, 4),))\n")
    result = runner.invoke(app, ["tune", "--pipeline", f"{factory}:pipeline", "--bound", "cosine>=0.99",
                                 "--db", str(tmp_path / "t.sqlite")])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "(RuntimeError: this model cannot run)" in errors[0], result.stderr
