"""mixprec.tune: bound grammar, group testing, search on a synthetic model, cache, worker."""

from __future__ import annotations

import math
import statistics
import random
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from mixprec.bench.store import Store
from mixprec.policy import Policy
from mixprec.tuning.bounds import METRICS, Bound, parse_bound, worst_case
from mixprec.tuning.evaluators import InProcessEvaluator, WorkerEvaluator
from mixprec.tuning.group_testing import minimal_sufficient
from mixprec.tuning.report import render_tune_html
from mixprec.measure.stats import paired_ratio
from mixprec.tuning.retiming import pick_final
from mixprec.tuning.tuner import tune

from tune_models import SMALL_SENSITIVE as SENSITIVE, LayerBlock as Block, inputs as _inputs, small as synthetic_model


def _model() -> nn.Sequential:
    return synthetic_model("layer")


@pytest.fixture(scope="module")
def evaluator():
    model = _model()
    return InProcessEvaluator(model, _inputs, model, seeds=(0, 1), repeat=1, name="synthetic-16")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The searches here run their tiny models in this process: on one thread, as in ``make test``
    (its pytest-xdist workers share the cores out, tests/conftest.py). With torch's default of one
    thread per core, OpenMP's spinning helper threads cost many times the arithmetic on a busy
    machine when the module runs alone (``pytest tests/tuning/test_tune.py``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# -- bounds -------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("sqnr>=30", Bound("sqnr", ">=", 30.0)),
    (" SNR > 25.5 ", Bound("snr", ">", 25.5)),
    ("rel_err<=1e-2", Bound("rel_err", "<=", 0.01)),
    ("token_agreement>=0.99", Bound("token_agreement", ">=", 0.99)),
    ("max_abs_err < .5", Bound("max_abs_err", "<", 0.5)),
    ("step_sqnr>=30", Bound("step_sqnr", ">=", 30.0)),
])
def test_parse_bound_valid(text, expected):
    assert parse_bound(text) == expected


@pytest.mark.parametrize("text", ["sqnr", "sqnr=>30", "loudness>=3", "sqnr>=abc", "", "30<=sqnr"])
def test_parse_bound_invalid_lists_grammar_and_metrics(text):
    with pytest.raises(ValueError) as info:
        parse_bound(text)
    message = str(info.value)
    assert repr(text) in message and "<metric> <op> <number>" in message
    assert all(metric in message for metric in METRICS)


def test_a_diffusion_session_measures_the_teacher_forced_step_sqnr():
    from mixprec import pipelines
    from mixprec.policy import Rule
    from mixprec.tuning.session import Session

    pipe = pipelines.get("diffusion", size="test", seed=0)
    session = Session(pipe, lambda seed: pipe.example_inputs(1, seed), pipe.run, seeds=[0], kind="image",
                      teacher_force=pipe.teacher_forced)
    fp32 = session.qualities(Policy((Rule("*", storage="fp32"),)), [0])[0]
    bf16 = session.qualities(Policy((Rule("*", storage="bf16"),)), [0])[0]
    assert fp32["step_sqnr_db"] == math.inf and fp32["psnr_db"] == math.inf
    assert 15 < bf16["step_sqnr_db"] < 45 and not parse_bound("step_sqnr>=50").met(bf16)


def test_bound_direction():
    high, low = parse_bound("sqnr>=30"), parse_bound("rel_err<0.1")
    assert high.met({"sqnr_db": 31}) and not high.met({"sqnr_db": 29}) and high.miss({"sqnr_db": 25}) == 5
    assert low.met({"rel_err": 0.05}) and not low.met({"rel_err": 0.1}) and low.miss({"rel_err": 0.3}) == pytest.approx(0.2)
    assert not high.met({"sqnr_db": math.nan}) and high.miss({}) == math.inf


def test_worst_case_over_seeds():
    worst = worst_case([{"sqnr_db": 40.0, "rel_err": 0.01}, {"sqnr_db": 35.0, "rel_err": 0.02}])
    assert worst == {"sqnr_db": 35.0, "rel_err": 0.02}


# -- group testing ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_minimal_sufficient_without_a_useful_prior(seed):
    rng = random.Random(seed)
    units = [f"m{i}" for i in range(64)]
    rng.shuffle(units)
    needed = set(rng.sample(units, 3))
    calls = []

    def suffices(keep):
        calls.append(keep)
        return needed <= keep

    assert set(minimal_sufficient(units, suffices)) == needed
    assert len(calls) <= 2 * 3 * math.log2(64 / 3) + 2 * 3  # adaptive group testing: ~2 k log2(n / k)


def test_minimal_sufficient_with_a_good_prior_is_cheap():
    units = [f"m{i}" for i in range(64)]
    calls = []

    def suffices(keep):
        calls.append(keep)
        return {"m0", "m1", "m2"} <= keep

    assert minimal_sufficient(units, suffices) == ["m0", "m1", "m2"]
    assert len(calls) <= 8


# -- synthetic search ---------------------------------------------------------------------------


def test_tune_finds_the_three_sensitive_modules(evaluator):
    result = tune("synthetic", "sqnr>=30", evaluator=evaluator, objective="memory", dtypes=("bf16",),
                  local_search=False)
    assert result.met
    assert sorted(result.keep_fp32) == sorted(f"{i}.fc2" for i in SENSITIVE)
    assert result.evaluations <= 16  # baseline + 2 starts + ~7 group tests with the profile prior (limit: 40)
    assert result.chosen.evaluation.quality["sqnr_db"] >= 30
    assert result.policy.name == "tuned" and all(rule.reason for rule in result.policy.rules)
    assert Policy.from_toml(result.to_toml()) == result.policy
    assert [c.step for c in result.path[:2]] == ["baseline fp32", "all-bf16"]
    html = render_tune_html(result)
    assert html.startswith("<!doctype html>") and "data:image/png;base64," in html


def test_frontier_is_not_dominated(evaluator):
    result = tune("synthetic", "sqnr>=30", evaluator=evaluator, dtypes=("bf16",), budget=20)
    assert result.frontier and result.evaluations <= 20

    def vector(c):
        return (c.evaluation.latency_s, c.evaluation.memory_bytes, -result.bound.score(c.evaluation.quality))

    for f in result.frontier:
        for other in result.path:
            a, b = vector(other), vector(f)
            assert not (all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b)))


def test_store_cache_reused(evaluator, tmp_path):
    kwargs = dict(evaluator=evaluator, objective="memory", dtypes=("bf16",), local_search=False)
    with Store(tmp_path / "tune.db") as store:
        first = tune("synthetic", "sqnr>=30", store=store, **kwargs)
    with Store(tmp_path / "tune.db") as store:
        second = tune("synthetic", "sqnr>=30", store=store, **kwargs)
        stored = store.load_tune_run(store.tune_runs()[0]["id"])
    assert first.evaluations > 0 and second.evaluations == 0
    assert second.cached >= first.evaluations
    assert second.keep_fp32 == first.keep_fp32
    # per-seed quality survives the store: the reused run reports the same spread
    assert second.chosen.evaluation.per_seed == first.chosen.evaluation.per_seed
    assert second.seed_summary == first.seed_summary
    assert stored["result"]["validation"]["seeds"] == [2, 3, 4] and "sqnr_db" in stored["result"]["seed_summary"]


def test_budget_too_small_names_the_number(evaluator):
    with pytest.raises(ValueError, match=r"budget=3 is too small for one pass over 32 modules: it needs at least 8 evaluations"):
        tune("synthetic", "sqnr>=30", evaluator=evaluator, budget=3, dtypes=("bf16",))


def test_unmeetable_bound_reports_closest(evaluator):
    progress = []
    result = tune("synthetic", "cosine>1.5", evaluator=evaluator, dtypes=("bf16",), budget=12,
                  progress=lambda p: progress.append((p.evaluations, p.budget, p.best)))
    assert not result.met and result.closest is not None
    assert result.miss == pytest.approx(0.5)
    assert progress and progress[-1][1] == 12 and progress[-1][2] is None


# -- worker -------------------------------------------------------------------------------------


#: A factory whose worker imports nothing beyond torch and mixprec (tests/small_factory.py): the smoke test is
#: about the worker's requests and answers; the minilm pipeline in a worker is tests/tuning/test_tuner.py's.
SMALL = f"{Path(__file__).parents[1] / 'small_factory.py'}:build"


def test_worker_evaluator_smoke():
    with WorkerEvaluator(SMALL, "test", seeds=(0,), repeat=1, timeout=300) as ev:
        result = tune("small", "cosine>=0.99", evaluator=ev, dtypes=("bf16",), budget=12, local_search=False)
    assert result.evaluations <= 12 and result.path[0].evaluation.quality["cosine"] == pytest.approx(1.0)
    assert result.met


def test_bound_on_a_metric_the_target_lacks(evaluator):
    with pytest.raises(ValueError, match=r"psnr_db.*metrics available here: sqnr, cosine, rel_err, max_abs_err"):
        tune("synthetic", "psnr>=30", evaluator=evaluator, dtypes=("bf16",))


def test_tune_with_local_search_keeps_exactly_the_sensitive_blocks_within_40(evaluator):
    result = tune("synthetic", "sqnr>=30", evaluator=evaluator, objective="memory", dtypes=("bf16",), budget=40)
    assert result.met and result.evaluations <= 40
    assert sorted(result.keep_fp32) == sorted(f"{i}.fc2" for i in SENSITIVE)
    assert any(c.step.startswith("local:") for c in result.path)


def test_presets_are_candidates_and_never_beat_the_result(evaluator):
    result = tune("synthetic", "sqnr>=30", evaluator=evaluator, dtypes=("bf16",), presets=("quality", "fast"),
                  local_search=False, final_rounds=0)
    steps = [c.step for c in result.path]
    assert "preset quality" in steps and "preset fast" in steps
    cost = (result.chosen.evaluation.latency_s, result.chosen.evaluation.memory_bytes)
    for c in result.path:
        if c.met:
            assert cost <= (c.evaluation.latency_s, c.evaluation.memory_bytes)
    with pytest.raises(ValueError, match="unknown preset 'turbo'; valid: quality, balanced, fast, memory"):
        tune("synthetic", "sqnr>=30", evaluator=evaluator, dtypes=("bf16",), presets=("turbo",))


def test_should_stop_keeps_what_was_measured(evaluator, tmp_path):
    events = []
    with Store(tmp_path / "tune.db") as store:
        result = tune("synthetic", "sqnr>=30", evaluator=evaluator, dtypes=("bf16",), store=store,
                      progress=events.append, should_stop=lambda: bool(events) and events[-1].evaluations >= 3)
        runs = store.tune_runs()
        stored = store.load_tune_run(runs[0]["id"])
    candidates = [e for e in events if e.work is None]  # the others say what runs meanwhile
    assert result.evaluations == 3 and len(result.path) == len(candidates)
    assert any("stopped on request" in note for note in result.notes)
    assert events[-1].evaluations == 3 and events[-1].latest is result.path[-1] and events[-1].work is None
    assert len(runs) == 1 and runs[0]["evaluations"] == 3 and runs[0]["pipeline"] == "synthetic"
    assert len(stored["result"]["path"]) == len(result.path) and Policy.from_toml(stored["policy_toml"]) == result.policy
    assert result.status == stored["result"]["status"] == "cancelled"


def test_final_check_retimes_finalists_side_by_side(evaluator):
    result = tune("synthetic", "sqnr>=30", evaluator=evaluator, dtypes=("bf16",), presets=("quality", "fast"),
                  local_search=False, final_rounds=2)
    assert len(result.final) >= 2 and all(len(v) == 2 for v in result.final.values())
    met_presets = [c for c in result.path if c.met and c.step.startswith("preset ")]
    assert min(met_presets, key=lambda c: c.evaluation.latency_s).index in result.final
    presets = [i for i in result.final if i == 0 or result.path[i].step.startswith("preset ")]
    assert result.chosen.index == pick_final(result.final, presets, margin=0.03)[0]
    assert any(note.startswith("final check:") for note in result.notes)
    assert any(" kept: " in note or " chosen: " in note for note in result.notes)
    assert 0 in result.final  # the fp32 baseline is re-timed with the finalists
    assert result.speedup == pytest.approx(paired_ratio(result.final[0], result.final[result.chosen.index]).value)
    page = render_tune_html(result)
    assert "Final check: the finalists re-timed side by side" in page and "<th>round 2 ms</th>" in page
    assert page.count("<tr class=chosen>") == 2  # in the re-timing table and on the path
    assert f"Chosen: #{result.chosen.index} (" in page


@pytest.mark.parametrize("final, presets, winner", [
    ({1: [1.0, 1.0, 1.0], 2: [0.9, 1.1, 0.9]}, [1], 1),       # faster median, not every round: the preset stays
    ({1: [1.0, 1.0, 1.0], 2: [0.9, 0.95, 0.99]}, [1], 2),     # faster in every round
    ({1: [1.0, 1.0, 1.0], 2: [0.9, 0.9, 0.9], 3: [0.8, 0.8, 0.95]}, [1], 3),  # the faster of two clear winners
    ({1: [1.0, 1.0], 4: [1.2, 1.2], 2: [0.99, 0.99]}, [1, 4], 1),  # incumbent: the faster preset; 2 rounds decide nothing
    ({2: [0.5, 0.6, 0.7], 3: [0.6, 0.5, 0.55]}, [], 3),        # no preset: the smallest median
])
def test_pick_final_prefers_the_preset_unless_beaten_in_every_round(final, presets, winner):
    assert pick_final(final, presets)[0] == winner


def test_pick_final_on_a_noisy_machine_is_undecided_and_keeps_the_safer():
    """Rounds in which load came and went: the challenger's median is lower, its paired
    interval holds 1, so the fp32 baseline stays and the note says why."""
    final = {0: [1.0, 0.4, 2.0, 0.5, 1.5, 0.8, 1.2], 5: [0.6, 0.9, 1.0, 0.7, 2.1, 0.5, 1.3]}
    index, why = pick_final(final, [0])
    assert index == 0 and "undecided on this machine: #5 vs #0" in why
    steady = {0: [1.0, 0.4, 2.0, 0.5, 1.5, 0.8, 1.2], 5: [0.5, 0.2, 1.0, 0.25, 0.75, 0.4, 0.6]}
    index, why = pick_final(steady, [0])  # the same load, always half the time: decided
    assert index == 5 and "#5 chosen: 2.00x" in why


def test_pick_final_margin():
    final = {1: [1.0, 1.0, 1.0], 2: [0.98, 0.99, 0.97]}
    assert pick_final(final, [1])[0] == 2
    index, why = pick_final(final, [1], margin=0.03)  # 2% faster: within the margin
    assert index == 1 and "more than 3%" in why
    assert pick_final({1: [1.0, 1.0, 1.0], 2: [0.9, 0.9, 0.9]}, [1], margin=0.03)[0] == 2


def test_minimal_sufficient_gives_up_past_max_prefix():
    units = [f"m{i}" for i in range(64)]
    calls = []

    def suffices(keep):
        calls.append(keep)
        return {"m40", "m50"} <= keep

    assert minimal_sufficient(units, suffices, max_prefix=32) is None and len(calls) == 2
    assert minimal_sufficient(units, suffices, max_prefix=60) == ["m40", "m50"]


class TwoTowers(nn.Module):
    """Two components; only ``b`` holds a precision-sensitive block."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Sequential(*[Block(32, False) for _ in range(8)])
        self.b = nn.Sequential(*[Block(32, i == 5) for i in range(8)])

    def forward(self, x):
        return self.b(self.a(x))


def test_component_pass_then_modules_inside_the_needed_component():
    model = TwoTowers().eval()
    components = {"a": model.a, "b": model.b}
    ev = InProcessEvaluator(components, _inputs, model, seeds=(0, 1), repeat=1, name="two-towers")
    result = tune("two-towers", "sqnr>=30", evaluator=ev, objective="memory", dtypes=("bf16",), local_search=False)
    assert result.met and result.keep_fp32 == ["b.5.fc2"]
    steps = [c.step for c in result.path]
    assert any(s.startswith("bisect components") for s in steps) and "verify components b" in steps
    assert any("components needed in fp32: b" in n for n in result.notes)


def test_no_fast_16bit_type_latency_search_stays_fp32(evaluator):
    result = tune("synthetic", "sqnr>=30", evaluator=evaluator, dtypes=(), budget=20, final_rounds=0)
    steps = [c.step for c in result.path]
    assert not any(step.startswith("all-") for step in steps)
    assert any(step.startswith("local: matmul") for step in steps)
    assert not any("upcast_attention" in step for step in steps)
    assert all(rule.storage in (None, "fp32") for rule in result.policy.rules)
    assert any("cannot win on latency" in note for note in result.notes)


def test_no_fast_16bit_type_memory_search_stores_reduced_weights_with_fp32_compute(evaluator):
    result = tune("synthetic", "sqnr>=30", evaluator=evaluator, objective="memory", dtypes=(), budget=40)
    assert {"all-bf16 compute fp32", "all-fp16 compute fp32", "all-fp8 compute fp32"} <= {c.step for c in result.path}
    assert result.met and result.policy.rules[0].storage in ("bf16", "fp16", "fp8") and result.policy.rules[0].compute == "fp32"
    assert result.chosen.evaluation.memory_bytes < result.path[0].evaluation.memory_bytes / 1.9


# -- issue: held-out validation, margin, hierarchical prior -------------------------------------

from mixprec.tuning.bounds import tightened  # noqa: E402
from mixprec.tuning.group_testing import ModuleTree, hierarchical_keep  # noqa: E402
from mixprec.tuning.validation import seed_summary, validation_seed_list  # noqa: E402
from tune_models import gated, shifted_inputs  # noqa: E402

FRESH = tuple(range(100, 110))


def _tuned(kind: str, bound: str = "sqnr>=40"):
    net = synthetic_model(kind)
    ev = InProcessEvaluator(net, _inputs, net, seeds=(0, 1), repeat=1, name=f"synthetic-{kind}")
    # the 16-bit search's budget: the fp8 step (tests/tuning/test_tune_fp8.py) is measured apart
    result = tune(kind, bound, evaluator=ev, objective="memory", dtypes=("bf16",), local_search=False, fp8=False)
    return ev, result


@pytest.mark.parametrize("kind, limit", [("block", 20), ("layer", 16), ("both", 20)])
def test_hierarchical_prior_finds_the_sensitive_blocks_within_budget(kind, limit):
    ev, result = _tuned(kind)
    assert result.met and result.evaluations <= limit, [c.step for c in result.path]
    kept = set(result.keep_fp32)
    for i in SENSITIVE:  # the sensitive block itself, or layers inside it
        assert any(k == str(i) or k.startswith(f"{i}.") for k in kept), kept
    assert all(k.split(".")[0] in {str(i) for i in SENSITIVE} for k in kept), kept
    if kind == "layer":
        assert sorted(kept) == sorted(f"{i}.fc2" for i in SENSITIVE)
    if kind == "block":
        assert sorted(kept) == sorted(str(i) for i in SENSITIVE)
        assert sum("kept whole, its error comes from how its layers combine" in n for n in result.notes) == 3
    # the promise holds on inputs neither the search nor the validation saw
    fresh = worst_case(list(ev.validate(result.policy, FRESH).values()))
    assert fresh["sqnr_db"] >= 40, fresh["sqnr_db"]
    assert result.validation["met"] and result.validation["seeds"] == [2, 3, 4]
    assert result.search_bound == Bound("sqnr", ">=", 41.0) and result.margin_db == 1.0


def test_block_level_error_is_invisible_per_layer_and_visible_per_block():
    import mixprec

    net = synthetic_model("block")
    prof = mixprec.profile(net, _inputs(0), Policy((mixprec.Rule("*", storage="bf16"),)))
    stats = {s.module: s for s in prof.modules}
    layers = [s.own_sqnr_db for s in prof.modules if s.owns_weights]
    assert min(layers) > 40  # every layer rounds like any other
    for i in SENSITIVE:
        assert stats[str(i)].own_sqnr_db < 30 and not stats[str(i)].owns_weights
    assert stats["6"].own_sqnr_db > 40
    suggested = {s["match"] for s in prof.suggestions(min_own_sqnr_db=35)}
    assert suggested == {str(i) for i in SENSITIVE}  # the blocks, not their harmless layers
    # leaves only (the former profile): nothing tells the sensitive blocks apart
    flat = mixprec.profile(net, _inputs(0), Policy((mixprec.Rule("*", storage="bf16"),)), blocks=False)
    assert all(s.own_sqnr_db is None for s in flat.modules if not s.owns_weights)


def test_hierarchical_keep_counts_on_a_known_tree():
    """Group testing over 64 blocks of 2 layers each, 3 needed: per layer, per block."""
    units = [f"{b}.{leaf}" for b in range(64) for leaf in ("fc1", "fc2")]
    risky = {7, 30, 51}

    def rows(per_block: bool):
        out = []
        for b in range(64):
            out.append({"module": str(b), "own_sqnr_db": 20.0 if b in risky else 50.0, "overflows_fp16": False,
                        "own_nonfinite": False, "unit": False})
            for leaf in ("fc1", "fc2"):
                bad = b in risky and leaf == "fc2" and not per_block
                out.append({"module": f"{b}.{leaf}", "own_sqnr_db": 15.0 if bad else 48.0 + b / 100,
                            "overflows_fp16": False, "own_nonfinite": False, "unit": True})
        return out

    for per_block, need, limit in [(True, {str(b) for b in risky}, 10), (False, {f"{b}.fc2" for b in risky}, 11)]:
        calls = []

        def suffices(keep):
            calls.append(keep)
            covered = {u for u in units if any(u == k or u.startswith(k + ".") for k in keep)}
            return all(any(u in covered for u in units if u == n or u.startswith(n + ".")) for n in need) and (
                not per_block or all(f"{n}.fc1" in covered and f"{n}.fc2" in covered for n in need))

        tree = ModuleTree(rows(per_block), units)
        kept = hierarchical_keep(tree, tree.inside(""), suffices)
        assert set(kept) == need and len(calls) <= limit, (per_block, kept, len(calls))


def test_module_tree_passes_through_single_children():
    units = ["enc.layers.0.fc", "enc.layers.1.fc", "head"]
    rows = [{"module": u, "own_sqnr_db": 40.0, "overflows_fp16": False, "own_nonfinite": False, "unit": True}
            for u in units]
    tree = ModuleTree(rows, units)
    assert sorted(tree.inside("")) == ["enc", "head"]
    assert tree.inside("enc") == ["enc.layers.0", "enc.layers.1"]  # through the lone ModuleList
    assert tree.own_db("enc") is None and tree.risk("enc") == (True, 40.0)  # unmeasured: its riskiest child


def test_validation_steps_along_the_frontier_when_held_out_seeds_miss():
    net = gated()
    ev = InProcessEvaluator(net, shifted_inputs, net, seeds=(0, 1), repeat=1, name="gated")
    result = tune("gated", "sqnr>=30", evaluator=ev, objective="memory", dtypes=("bf16",), local_search=False,
                  final_rounds=0)
    tried = result.validation["tried"]
    assert not tried[0]["met"] and tried[-1]["met"] and len(tried) >= 2 and result.validations == len(tried)
    assert result.chosen.index == tried[-1]["index"] != tried[0]["index"]
    assert any("on a validation seed" in n and "stepped to" in n for n in result.notes)
    assert result.met and result.validation["met"] and result.validation["worst"] >= 30
    worst = worst_case(list(ev.validate(result.policy, (2, 3, 4)).values()))
    assert worst["sqnr_db"] >= 30
    # without validation, the search's choice stands and the result says it was not checked
    blind = tune("gated", "sqnr>=30", evaluator=ev, objective="memory", dtypes=("bf16",), local_search=False,
                 final_rounds=0, validation_seeds=0)
    assert blind.validation is None and blind.met
    assert any(n.startswith("warning: validation disabled") for n in blind.notes)
    assert worst_case(list(ev.validate(blind.policy, (2, 3, 4)).values()))["sqnr_db"] < 30
    assert "Not validated" in render_tune_html(blind)


def test_seed_summary_covers_search_and_validation_seeds(evaluator):
    result = tune("synthetic", "sqnr>=30", evaluator=evaluator, objective="memory", dtypes=("bf16",),
                  local_search=False, validation_seeds=(5, 6, 7))
    summary = result.seed_summary["sqnr_db"]
    values = [result.chosen.evaluation.per_seed[s]["sqnr_db"] for s in (0, 1)]
    values += [result.validation["tried"][-1]["per_seed"][s]["sqnr_db"] for s in (5, 6, 7)]
    assert summary["seeds"] == 5 and summary["worst"] == min(values)
    assert summary["median"] == pytest.approx(statistics.median(values))
    assert summary["spread"] == pytest.approx(max(values) - min(values))
    data = result.to_dict()
    assert data["validation"]["seeds"] == [5, 6, 7] and data["seed_summary"]["sqnr_db"]["seeds"] == 5
    assert data["search_bound"] == "sqnr>=31" and data["margin_db"] == 1.0
    page = render_tune_html(result)
    assert "On seeds 5, 6, 7, never used by the search, the chosen policy meets sqnr&gt;=30" in page
    assert "<th>spread</th>" in page


@pytest.mark.parametrize("bound, margin, expected", [
    ("sqnr>=40", 1.0, "sqnr>=41"),
    ("psnr>30", 2.0, "psnr>32"),
    ("rel_err<=0.01", 1.0, "rel_err<=0.00891251"),
    ("cosine>=0.99", 1.0, "cosine>=0.992057"),
    ("cosine>=1", 1.0, "cosine>=1"),
    ("token_agreement>=0.9", 0.0, "token_agreement>=0.9"),
    ("step_sqnr>=30", 1.0, "step_sqnr>=31"),
])
def test_margin_tightens_each_kind_of_metric(bound, margin, expected):
    assert str(tightened(parse_bound(bound), margin)) == expected


def test_bad_validation_seeds_and_margin(evaluator):
    with pytest.raises(ValueError, match=r"validation seeds \[1, 9\] overlap the search seeds \[0, 1\] \(both hold 1\)"):
        tune("synthetic", "sqnr>=30", evaluator=evaluator, validation_seeds=(1, 9))
    with pytest.raises(ValueError, match=r"margin -1.0: expected a finite number of dB >= 0"):
        tune("synthetic", "sqnr>=30", evaluator=evaluator, margin=-1)
    assert validation_seed_list(3, (0, 1)) == (2, 3, 4) and validation_seed_list(0, (0, 1)) == ()
    assert validation_seed_list([9, 8, 9], (0, 1)) == (9, 8)
    with pytest.raises(ValueError, match="count >= 0"):
        validation_seed_list(-2, (0, 1))


def test_seed_summary_of_exact_outputs_has_no_spread():
    assert seed_summary({0: {"sqnr_db": math.inf}, 1: {"sqnr_db": math.inf}})["sqnr_db"]["spread"] == 0.0



def test_stop_request_during_validation_keeps_the_search_result():
    net = gated()
    ev = InProcessEvaluator(net, shifted_inputs, net, seeds=(0, 1), repeat=1, name="gated")
    validated = []
    original = ev.validate

    def validate(policy, seeds):
        validated.append(policy)
        return original(policy, seeds)

    ev.validate = validate
    result = tune("gated", "sqnr>=30", evaluator=ev, objective="memory", dtypes=("bf16",), local_search=False,
                  final_rounds=0, should_stop=lambda: bool(validated))
    assert len(validated) == 1 and result.validations == 1 and not result.validation["met"]
    assert any(n.startswith("validation stopped on request") for n in result.notes)


class TestSpeedTextClaimsOnlyWhatItsRoundsSupport:
    """``TuneResult.speed_text``: a speed against fp32 with its interval from the side-by-side
    re-timing, said faster or slower only where that interval is wholly on one side of 1."""

    @pytest.mark.parametrize(("final", "chosen", "said"), [
        ({0: [1.0, 1.1, 0.9, 1.0, 1.05], 1: [0.5, 0.55, 0.45, 0.5, 0.52]}, 1, ": faster than fp32"),
        ({0: [1.0, 1.1, 0.9, 1.0, 1.05], 1: [2.0, 2.2, 1.8, 2.0, 2.1]}, 1, ": slower than fp32"),
        ({0: [1.0, 1.1, 0.9, 1.0, 1.05], 1: [1.0, 1.0, 1.0, 1.1, 0.95]}, 1, ": undecided against fp32 on this machine"),
        ({0: [1.0, 1.0], 1: [0.5, 0.5]}, 1, ": undecided against fp32 on this machine"),  # two rounds
        ({}, 1, "undecided against fp32: not re-timed side by side"),  # search medians only
        ({}, 0, "fp32 itself"),
    ])
    def test_speed_text(self, final, chosen, said):
        from mixprec.tuning.candidates import Candidate, Evaluation
        from mixprec.tuning.result import TuneResult

        path = [Candidate(i, "baseline" if i == 0 else "all-bf16", Policy(),
                          Evaluation(latency_s=1.0 / (1 + i), memory_bytes=1e6, quality={"cosine": 1.0}), True, 0.0)
                for i in range(2)]
        result = TuneResult(policy=Policy(name="tuned"), bound=parse_bound("cosine>=0.99"), objective="latency", met=True,
                            chosen=path[chosen], closest=None, miss=None, frontier=path, evaluations=2, cached=0, wall_s=1.0,
                            path=path, final=final)
        text = result.speed_text()
        assert said in text
        if text.startswith("undecided"):  # the medians' ratio is said as what it is, after the verdict
            assert "the search's medians, taken at different moments, give 2.00x" in text
        elif chosen:
            assert text.startswith(f"{result.speed.text()} the speed of fp32 over {result.speed.n} paired rounds")
