"""The pre-run note: a user policy's rules that match no module are said once, before the run, in
mixprec's words, and kept with the result; never as a Python warning with a source path. For
``bench`` (the local executor and Ray) and ``tune`` (the CLI, and the API on an in-process evaluator)."""

from __future__ import annotations

import json
import logging
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import mixprec
from mixprec.bench.store import Store
from mixprec.cli import app
from mixprec.config.names import forget_said
from mixprec.policy.select import UnmatchedRuleWarning
from mixprec.tuning.evaluators import InProcessEvaluator
from mixprec.tuning.tuner import tune
from ray_cluster import ON_THE_CLUSTER

runner = CliRunner()

#: A pipeline whose tune worker loads in no time beyond torch's import (tests/small_factory.py).
SMALL = f"{Path(__file__).parents[1] / 'small_factory.py'}:build"

_NOTE = "p.toml: policy rule #0 'encoder.nothing_here' matches no module; closest: "
#: A Python warning as its default handler prints it: "path.py:12: UnmatchedRuleWarning: ...".
_RAW = re.compile(r"\.py:\d+: \w*Warning")


@pytest.fixture
def policy_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.toml").write_text('[[rules]]\nmatch = "encoder.nothing_here"\nkeep_fp32 = true\n\n'
                                     '[[rules]]\nmatch = "*"\nstorage = "bf16"\noptional = true\n')
    forget_said()  # each command is a process of its own; here earlier tests ran in this one
    return tmp_path / "p.toml"


def _said_once(output: str, prefix: str = "minilm: ") -> None:
    assert output.count("warning: " + prefix + _NOTE) == 1, output
    assert not _RAW.search(output) and "UserWarning" not in output and "UnmatchedRuleWarning" not in output


def test_bench_says_it_before_the_run_and_keeps_it_in_the_run(policy_file, tmp_path):
    db = tmp_path / "b.sqlite"
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # a raw warning anywhere in this process would be printed
        result = runner.invoke(app, ["bench", "--pipeline", "minilm", "--size", "test", "--configs", "p.toml,fp32",
                                     "--repeat", "1", "--warmup", "0", "--budget", "10m", "--db", str(db)])
    assert result.exit_code == 0, result.output
    _said_once(result.output)
    assert result.output.index("warning: minilm: " + _NOTE) < result.output.index("run 1")  # before the run
    assert result.output.count(_NOTE) == 1, result.output  # not said again as the run's note
    run = Store(db).load_run(1)
    assert sum(n.startswith(_NOTE) for n in run["notes"]) == 1
    # One message per fact: the configuration moved and the budget's plan are said once each, before the table,
    # and kept in the run's notes.
    said = " ".join(result.output.split())  # the terminal's line breaks undone
    plan = next(n for n in run["notes"] if n.startswith("batch 1: ") and "per configuration" in n)
    for fact in ("fp32 moved first: it is the reference", plan.removeprefix("batch 1: ")):
        fact = " ".join(fact.split())
        assert said.count(fact) == 1 and said.index(fact) < said.index("run 1: minilm"), (fact, result.output)
        assert any(" ".join(n.split()).endswith(fact) or fact in " ".join(n.split()) for n in run["notes"])


@ON_THE_CLUSTER
def test_bench_on_ray_gets_the_same_note(policy_file, tmp_path):
    from ray_cluster import two_types

    two_types()
    db = tmp_path / "b.sqlite"
    small = "small_factory:build"  # tests/small_factory.py (tests/ is on the cluster workers' path): imports only torch
    result = runner.invoke(app, ["bench", "--executor", "ray", "--hardware", "alpha", "--pipeline", small, "--size", "test",
                                 "--configs", "fp32,p.toml", "--repeat", "1", "--warmup", "0", "--db", str(db)])
    assert result.exit_code == 0, result.output
    _said_once(result.output, prefix=f"{small}: ")
    assert result.output.index(f"warning: {small}: " + _NOTE) < result.output.index("run 1")
    assert sum(n.startswith(_NOTE) for n in Store(db).load_run(1)["notes"]) == 1


def test_tune_measures_a_user_policy_and_says_its_unmatched_rules_once(policy_file, tmp_path):
    args = ["tune", "--pipeline", SMALL, "--size", "test", "--bound", "cosine>=0.99", "--budget", "16", "--seeds", "1",
            "--repeat", "1", "--validation-seeds", "0", "--policy", "p.toml", "--db", str(tmp_path / "t.sqlite")]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    _said_once(result.output, prefix=f"{SMALL}: ")
    data = json.loads(result.stdout)
    assert sum(n.startswith(_NOTE) for n in data["notes"]) == 1
    assert "policy p.toml" in [c["step"] for c in data["path"]]  # measured as a candidate
    forget_said()  # a second command (its measurements reused from the store), its table printed
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    _said_once(result.output, prefix=f"{SMALL}: ")
    assert result.output.count(_NOTE) == 1, result.output  # not said again among the result's notes


def test_tune_refuses_a_policy_file_that_is_not_there(policy_file):
    result = runner.invoke(app, ["tune", "--pipeline", "minilm", "--size", "test", "--policy", "nope.toml"])
    assert result.exit_code == 2 and "nope.toml" in result.output and "Traceback" not in result.output


def test_the_tune_api_says_it_once_on_the_logger_and_in_the_notes(policy_file, caplog):
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))

    def inputs(seed: int):
        return torch.randn(8, 16, generator=torch.Generator().manual_seed(seed))

    caplog.set_level(logging.WARNING, logger="mixprec")
    evaluator = InProcessEvaluator(model, inputs, model, seeds=(0,), repeat=1, name="tiny")
    policy = mixprec.Policy((mixprec.Rule("0", storage="bf16"), mixprec.Rule("decoder", keep_fp32=True)), name="mine")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = tune("tiny", "sqnr>=20", evaluator=evaluator, policies=[policy], budget=12, final_rounds=0,
                      validation_seeds=0, progress=False, local_search=False)
    assert not [w for w in caught if issubclass(w.category, UnmatchedRuleWarning)]
    said = [r.getMessage() for r in caplog.records if "matches no module" in r.getMessage()]
    assert said == ["mine: policy rule #1 'decoder' matches no module; closest: " + said[0].split("closest: ")[1]]
    assert sum("mine: policy rule #1 'decoder'" in n for n in result.notes) == 1
    assert any(c.step == "policy mine" for c in result.path)
