"""A Ctrl-C at any moment of :func:`mixprec.tune`: what was measured is kept as an ``incomplete`` tune run.

The interrupt is raised where Python raises it, inside the work: from the progress callback
during the search, from the evaluator during the final check, the held-out validation and
the first evaluation. The real signal to a real ``mixprec tune`` is ``tests/cli/test_cli_interrupts.py``.
"""

from __future__ import annotations

import warnings

import pytest

from mixprec.bench.store import Store
from mixprec.policy import Policy
from mixprec.tuning.evaluators import InProcessEvaluator
from mixprec.tuning.tuner import TuneInterrupted, tune

from tune_models import inputs as _inputs, model as synthetic_model


class _Interrupting(InProcessEvaluator):
    """An in-process evaluator whose ``at`` step (``evaluate``, ``time``, ``validate``) raises
    KeyboardInterrupt, as a Ctrl-C does, on its ``after``-th call (counted from 1)."""

    def __init__(self, at: str, after: int = 1):
        model = synthetic_model("layer")
        super().__init__(model, _inputs, model, seeds=(0, 1), repeat=1, name="synthetic-64")
        self.at, self.after, self.calls = at, after, 0

    def _maybe(self, step: str) -> None:
        if step == self.at:
            self.calls += 1
            if self.calls == self.after:
                raise KeyboardInterrupt

    def evaluate(self, policy):
        self._maybe("evaluate")
        return super().evaluate(policy)

    def time(self, policy, repeat=1):
        self._maybe("time")
        return super().time(policy, repeat)

    def validate(self, policy, seeds):
        self._maybe("validate")
        return super().validate(policy, seeds)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _interrupted(evaluator, tmp_path, **options):
    with Store(tmp_path / "tune.db") as store:
        with pytest.raises(TuneInterrupted) as caught:
            tune("synthetic", "sqnr>=30", evaluator=evaluator, dtypes=("bf16",), store=store, **options)
        [listed] = store.tune_runs()
        stored = store.load_tune_run(listed["id"])
    assert isinstance(caught.value, KeyboardInterrupt) and caught.value.run_id == listed["id"]
    assert listed["status"] == stored["result"]["status"] == "incomplete"
    return caught.value, listed, stored


def test_ctrl_c_during_the_search_keeps_what_was_measured(tmp_path):
    def interrupt(event):
        if event.work is None and event.evaluations >= 3:
            raise KeyboardInterrupt  # after the third evaluation

    model = synthetic_model("layer")
    evaluator = InProcessEvaluator(model, _inputs, model, seeds=(0, 1), repeat=1, name="synthetic-64")
    caught, listed, stored = _interrupted(evaluator, tmp_path, progress=interrupt)
    assert str(caught) == f"tune run {listed['id']} stored as incomplete, with the 3 evaluations measured"
    result = caught.result
    assert result.status == "incomplete" and result.evaluations == listed["evaluations"] == 3
    assert "interrupted (Ctrl-C) during the search; the result holds what was measured" in stored["result"]["notes"]
    assert len(stored["result"]["path"]) == len(result.path) >= 3 and Policy.from_toml(stored["policy_toml"]) == result.policy


def test_ctrl_c_during_the_final_check_keeps_the_search(tmp_path):
    evaluator = _Interrupting("time")
    caught, listed, stored = _interrupted(evaluator, tmp_path, local_search=False, presets=("fast",))
    assert evaluator.calls == 1  # the final check started, and nothing ran after it
    result = caught.result
    assert result.final == {} and result.validation is None and result.evaluations == listed["evaluations"] > 2
    assert result.met and result.chosen.met  # the search's choice
    assert any(note.startswith("interrupted (Ctrl-C) during the final check") for note in stored["result"]["notes"])


def test_ctrl_c_during_the_validation_keeps_the_unvalidated_choice(tmp_path):
    evaluator = _Interrupting("validate")
    caught, _, stored = _interrupted(evaluator, tmp_path, local_search=False, final_rounds=0)
    assert caught.result.validation is None and stored["result"]["validation"] is None
    assert any(note.startswith("interrupted (Ctrl-C) during the held-out validation (the choice was not checked")
               for note in stored["result"]["notes"])


def test_ctrl_c_before_the_first_evaluation_keeps_a_run_with_nothing_measured(tmp_path):
    caught, listed, stored = _interrupted(_Interrupting("evaluate"), tmp_path)
    assert caught.result is None and listed["evaluations"] == 0 and stored["policy_toml"] == ""
    assert str(caught) == f"tune run {listed['id']} stored as incomplete, with the 0 evaluations measured"
    assert stored["result"]["notes"] == ["interrupted (Ctrl-C) before the first evaluation; nothing was measured"]


def test_without_a_store_the_interrupt_still_says_what_was_measured():
    with pytest.raises(TuneInterrupted, match=r"^the tune run stopped after 0 evaluations measured$"):
        tune("synthetic", "sqnr>=30", evaluator=_Interrupting("evaluate"), dtypes=("bf16",))
