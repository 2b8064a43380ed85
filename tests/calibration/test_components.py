"""Calibrating a model of several components, per component: each timed alone on its recorded calls.

The clock is scripted (:class:`LayerClock`: every ``Linear`` call costs what its component's
table says for the dtype it ran in), and the wall clock is frozen or ticks: no test times the machine.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from calibration_helpers import MLP, machine

import mixprec
from mixprec.calibration import cache as decisions
from mixprec.calibration import calibrate
from mixprec.calibration.components import PER_COMPONENT, freeze
from mixprec.casting.apply import applied_part
from mixprec.device.clock import Clock
from mixprec.policy import Policy, Rule
from mixprec.policy.select import resolve_modules

_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


class LayerClock(Clock):
    """Seconds from what ran: each ``Linear`` call of component ``c`` costs ``table[c][dtype]``
    (``fp32_medium`` at float32 matmul precision ``medium``, else ``fp32``). Nested calls are timed
    as a real clock times them: the outer call includes the inner ones."""

    name = "scripted"

    def __init__(self, components: dict[str, nn.Module], table: dict[str, dict[str, float]]):
        self.total = 0.0
        self.handles = []
        for cname, root in components.items():
            for module in root.modules():
                if isinstance(module, nn.Linear):
                    self.handles.append(module.register_forward_hook(self._hook(table[cname])))

    def _hook(self, costs: dict[str, float]):
        def hook(module, args, output):
            name = _NAMES[output.dtype]
            if name == "fp32" and torch.get_float32_matmul_precision() != "highest":
                name = f"fp32_{torch.get_float32_matmul_precision()}"
            self.total += costs.get(name, costs.get(name.split("_")[0], 1.0))
        return hook

    def time(self, call):
        start = self.total
        result = call()
        return result, self.total - start


def _frozen() -> float:
    return 0.0


class Sensitive(nn.Module):
    """Its output changes wholesale with tiny changes of its input: fine on its own inputs in fp32,
    it magnifies any error the component before it made."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        return torch.sin(3000.0 * self.proj(x.float()).float())


def _pair(**tables):
    a, b = MLP(), MLP(depth=2)
    comps = {"a": a, "b": b}
    return comps, LayerClock(comps, tables)


def _run(comps):
    def run(inputs):
        return comps["b"](comps["a"](*inputs))
    return run


@pytest.fixture
def x():
    return torch.randn(4, 32, generator=torch.Generator().manual_seed(1))


def _state(comps):
    return {f"{c}.{k}": v.clone() for c, m in comps.items() for k, v in m.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_each_component_keeps_its_own_fastest_option_and_the_composition_is_checked_end_to_end(x):
    # bf16 halves a's time and doubles b's: the fastest policy keeps a in bf16 and b in fp32.
    comps, clock = _pair(a={"fp32": 1.0, "bf16": 0.5, "fp16": 0.9}, b={"fp32": 1.0, "bf16": 2.0, "fp16": 2.0})
    before = _state(comps)
    result = calibrate(comps, "fast", (x,), run=_run(comps), hardware=machine(), clock=clock, cache=False, now=_frozen)
    assert result.chosen == PER_COMPONENT and result.decided and result.source == "measured"
    kept = {c["component"]: c["kept"] for c in result.components}
    assert kept["b"] == "fp32" and kept["a"] != "fp32", result.components
    assert _same(before, _state(comps)) and applied_part(comps) is None  # every trial reverted
    a_row = next(c for c in result.components if c["component"] == "a")
    assert a_row["vs_fp32"]["value"] == pytest.approx(2.0) and a_row["unit"] == "calls" and a_row["sqnr_db"] > 20
    assert any(r.startswith("checked end to end: ") for r in result.reasons), result.reasons
    # Time was left: paired whole runs against the rules closed the decision.
    assert any(r.startswith("confirmed end to end: the rules ran 0.") for r in result.reasons), result.reasons
    # The composed policy gives a its 16-bit weights and leaves b in fp32.
    with mixprec.apply(comps, result.policy):
        assert comps["a"].layers[0].weight.dtype != torch.float32
        assert comps["b"].layers[0].weight.dtype == torch.float32
        comps["b"](comps["a"](x))
    assert _same(before, _state(comps))
    assert result.headline().startswith("fast: per component (a ")
    assert mixprec.Calibration.from_dict(result.to_dict()) == result


def test_one_candidate_fastest_everywhere_is_kept_whole(x):
    comps, clock = _pair(a={"fp32": 1.0, "bf16": 0.5, "fp16": 0.9}, b={"fp32": 1.0, "bf16": 0.5, "fp16": 0.9})
    result = calibrate(comps, "fast", (x,), run=_run(comps), hardware=machine(), clock=clock, cache=False, now=_frozen)
    assert result.chosen != PER_COMPONENT and result.chosen != "fp32" and result.decided
    assert result.figure(result.chosen)["predicted"] is True


def test_a_composition_below_the_floor_moves_the_component_with_the_largest_own_error_back_first(x):
    a, b = MLP(), Sensitive()
    comps = {"a": a, "b": b}
    clock = LayerClock(comps, {"a": {"fp32": 1.0, "bf16": 0.5, "fp16": 0.9}, "b": {"fp32": 1.0, "bf16": 0.5, "fp16": 0.9}})
    result = calibrate(comps, "fast", (x,), run=lambda inputs: b(a(*inputs)), hardware=machine(), clock=clock, cache=False,
                       now=_frozen)
    kept = {c["component"]: c for c in result.components}
    assert kept["b"]["kept"] == "fp32" and kept["a"]["kept"] in ("fp32", "fp32-medium"), (kept, result.reasons)
    assert any(r.startswith("the rules ran 2.00x") and "misses fast's floor" in r for r in result.reasons)
    assert any("the largest own error, moves back to" in r and r.split(": ")[1].startswith("a,") for r in result.reasons), \
        result.reasons
    assert result.figure(PER_COMPONENT)["sqnr_db"] >= 20


def test_an_option_whose_own_error_misses_the_floor_is_out_for_that_component_only(x):
    comps, clock = _pair(a={"fp32": 1.0, "bf16": 0.5, "fp16": 0.9}, b={"fp32": 1.0, "bf16": 0.5, "fp16": 0.9})
    result = calibrate(comps, "fast", (x,), run=_run(comps), hardware=machine(), clock=clock, cache=False, now=_frozen,
                       floor_db=400.0)
    for comp in result.components:
        outs = {o["label"]: o["out"] for o in comp["options"]}
        assert outs["naive-bf16"] and "own SQNR" in outs["naive-bf16"] and "below fast's floor of 400 dB" in outs["naive-bf16"]
        assert comp["kept"] == "fp32"
    assert result.chosen == "fp32"


def test_a_component_decision_is_reused_by_another_model_built_from_it(x, tmp_path, monkeypatch):
    monkeypatch.setenv("MIXPREC_CACHE_DIR", str(tmp_path))
    comps, clock = _pair(a={"fp32": 1.0, "bf16": 0.5, "fp16": 0.9}, b={"fp32": 1.0, "bf16": 2.0, "fp16": 2.0})
    first = calibrate(comps, "fast", (x,), run=_run(comps), hardware=machine(), clock=clock, now=_frozen)
    assert first.decided and {r.get("component") for r in decisions.entries()} >= {"a", "b", None}
    # Another model: the same first component (other weights), a different second one.
    other = {"a": MLP(), "c": MLP(depth=4)}
    clock2 = LayerClock(other, {"a": {"fp32": 1.0, "bf16": 0.5}, "c": {"fp32": 1.0, "bf16": 0.5}})
    second = calibrate(other, "fast", (x,), run=lambda inputs: other["c"](other["a"](*inputs)), hardware=machine(),
                       clock=clock2, now=_frozen)
    rows = {c["component"]: c for c in second.components}
    assert rows["a"]["source"] == "cache" and rows["a"]["kept"].startswith("remembered ")
    assert [o["median_s"] for o in rows["a"]["options"]] == [None]  # one option, the remembered one: never timed
    assert rows["c"]["source"] == "measured" and len(rows["c"]["options"]) > 1
    with mixprec.apply(other, second.policy):  # a as it was decided on the first model
        assert other["a"].layers[0].weight.dtype == comps_policy_dtype(first, comps)
    # A second process with the same model reuses the whole decision without running it.
    again = calibrate(comps, "fast", (x,), run=_run(comps), hardware=machine(), clock=clock, now=_frozen)
    assert again.source == "cache" and again.policy == first.policy


def comps_policy_dtype(result, comps):
    with mixprec.apply(comps, result.policy):
        return comps["a"].layers[0].weight.dtype


def test_a_time_limit_leaves_components_undecided_and_their_rules_stay(x):
    comps, clock = _pair(a={"fp32": 1.0, "bf16": 0.5, "fp16": 0.9}, b={"fp32": 1.0, "bf16": 2.0, "fp16": 2.0})
    # The wall clock runs as the scripted one does: the recording takes 5 s, a round of every option 30.
    result = calibrate(comps, "fast", (x,), run=_run(comps), hardware=machine(), clock=clock, cache=False,
                       now=lambda: clock.total, time_limit=30.0)
    assert not result.decided and result.rounds < 5
    assert any(r.startswith("undecided: ") and "time limit (30 s)" in r for r in result.reasons), result.reasons


def test_freeze_gives_each_module_the_plan_of_its_components_choice():
    comps = {"a": MLP(), "b": MLP()}
    keep = Policy((Rule("*", storage="bf16"), Rule("a.layers.1", keep_fp32=True), Rule("b.layers.0", storage="fp16")))
    plans, _ = resolve_modules(comps, keep)
    by_component = {c: {id(p.module): p for p in plans if any(p.module is m for m in root.modules())}
                    for c, root in comps.items()}
    frozen = freeze(comps, by_component, "highest", "fast", {"a": "x", "b": "y"})
    again, _ = resolve_modules(comps, frozen)
    fields = ("storage", "compute", "keep_fp32", "upcast_attention", "output_dtype")
    assert [(p.qualname, *(getattr(p, f) for f in fields)) for p in plans] == \
           [(p.qualname, *(getattr(p, f) for f in fields)) for p in again]
    assert [r.match for r in frozen.rules] == ["a", "a.layers.1", "b", "b.layers.0"]


def test_a_long_component_called_once_is_timed_through_the_modules_it_calls():
    """A component called once whose call repeats one block many times: timing the block's
    recorded calls costs a fraction of the component's call, and the figure says it is predicted."""

    class Repeats(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = MLP(depth=1)
            self.head = nn.Linear(32, 32)

        def forward(self, x):
            for _ in range(40):
                x = self.block(x)
            return self.head(x)

    comps = {"pre": MLP(depth=1), "loop": Repeats()}
    clock = LayerClock(comps, {"pre": {"fp32": 1.0, "bf16": 0.5}, "loop": {"fp32": 1.0, "bf16": 0.5}})
    x = torch.randn(4, 32)
    result = calibrate(comps, "fast", (x,), run=lambda inputs: comps["loop"](comps["pre"](*inputs)), hardware=machine(),
                       clock=clock, cache=False, now=lambda: clock.total, time_limit=500.0)
    loop = next(c for c in result.components if c["component"] == "loop")
    assert loop["unit"] == "layers (predicted)" and loop["units"] == 2
    assert any(r.startswith("predicted: loop timed through the modules") for r in result.reasons)
    assert loop["vs_fp32"]["value"] == pytest.approx(2.0, rel=0.05)


def test_a_component_that_returns_tokens_is_timed_and_compared_through_the_modules_it_calls(x):
    """A decoding loop returns integer tokens: no own error can be read from them, and a sampled loop
    may run another length in 16 bits. Its per-step module is timed and compared instead."""

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.step = MLP(depth=1)

        def forward(self, h):
            for _ in range(6):
                h = self.step(h)
            return h.argmax(-1)

    comps = {"pre": MLP(depth=1), "dec": Decoder()}
    clock = LayerClock(comps, {"pre": {"fp32": 1.0, "bf16": 0.5}, "dec": {"fp32": 1.0, "bf16": 0.5}})
    result = calibrate(comps, "fast", (x,), run=lambda inputs: comps["dec"](comps["pre"](*inputs)).float(),
                       hardware=machine(), clock=clock, cache=False, now=_frozen)
    dec = next(c for c in result.components if c["component"] == "dec")
    assert dec["unit"] == "layers (predicted)" and dec["units"] == 1
    assert not any((o["out"] or "").startswith("failed") for o in dec["options"]), dec["options"]
    assert dec["sqnr_db"] is not None and dec["sqnr_db"] > 20
