"""A long profile says what it does, how far it is and about how long is left (scripted clock)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import mixprec
from mixprec.diagnose.progress import Meter, ProfileProgress
from mixprec.policy import Policy, Rule


class _Loop(nn.Module):
    """A block called ``steps`` times per run (a decoding loop), drawing noise each time."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps
        self.block = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        for _ in range(self.steps):
            x = x + 0.1 * self.block(x) + 0.01 * torch.randn_like(x)
        return self.head(x)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.25  # every reading is a quarter second later
        return self.now


POLICIES = [Policy((Rule("*", storage="bf16"),)), Policy((Rule("*", storage="fp16", compute="fp32"),)),
            Policy((Rule("block", storage="bf16"), Rule("head", keep_fp32=True)))]


class TestProfileProgress:
    @pytest.mark.parametrize("steps", [1, 3, 12])
    @pytest.mark.parametrize("policy", POLICIES, ids=["bf16", "fp16-fp32", "block-bf16"])
    def test_each_pass_reports_its_calls_up_to_the_total_and_the_profile_is_unchanged(self, steps, policy):
        torch.manual_seed(0)
        model, x = _Loop(steps), torch.randn(2, 8)
        torch.manual_seed(7)
        quiet = mixprec.profile(model, x, policy)
        events: list[ProfileProgress] = []
        torch.manual_seed(7)
        before = torch.get_rng_state()
        loud = mixprec.profile(model, x, policy, progress=events.append, clock=Clock())
        assert torch.equal(torch.get_rng_state(), before)  # the counting run draws nothing the caller sees
        # The counting run changes nothing the profile measures.
        assert [s.to_dict() if hasattr(s, "to_dict") else vars(s) for s in loud.modules] == \
            [s.to_dict() if hasattr(s, "to_dict") else vars(s) for s in quiet.modules]
        phases = [e.phase for e in events]
        assert phases[0].startswith("counting module calls")
        order = list(dict.fromkeys(phases))
        assert order == [phases[0], "fp32 pass and own errors", "pass under the policy"]
        calls = sum(s.calls for s in quiet.modules)
        for phase in order[1:]:
            mine = [e for e in events if e.phase == phase]
            assert mine[-1].done == mine[-1].total == calls  # the last report of a pass is its end
            assert [e.done for e in mine] == sorted(e.done for e in mine)
            assert all(e.left_s is None or e.left_s >= 0 for e in mine)
        assert events[-1].left_s == pytest.approx(0.0)
        assert [e.elapsed_s for e in events] == sorted(e.elapsed_s for e in events)
        assert f"{calls}/{calls} module calls (100%)" in events[-1].text()

    @pytest.mark.parametrize("interval, ticks", [(1.0, 40), (5.0, 40), (0.1, 10)])
    def test_the_meter_reports_at_most_once_per_interval_and_always_at_the_end(self, interval, ticks):
        now = [0.0]
        seen: list[ProfileProgress] = []
        meter = Meter(seen.append, clock=lambda: now[0], interval=interval)
        meter.start("work", ticks, later_s=30.0)
        for _ in range(ticks):
            now[0] += 0.5
            meter.tick()
        times = [e.elapsed_s for e in seen]
        assert all(b - a >= interval or b == times[-1] for a, b in zip(times[1:], times[2:]))
        assert seen[-1].done == ticks and seen[-1].left_s == pytest.approx(30.0)
        half = next(e for e in seen if e.done >= ticks // 2)
        assert half.left_s == pytest.approx(0.5 * (ticks - half.done) + 30.0)
        assert "about" in half.text() and "work:" in half.text()

    def test_without_a_callback_the_mixprec_logger_gets_the_progress(self, caplog):
        model, x = _Loop(2), torch.randn(2, 8)
        with caplog.at_level(logging.INFO, logger="mixprec"):
            mixprec.profile(model, x, POLICIES[0])
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mixprec profile: ")]
        assert any("pass under the policy" in line and "(100%)" in line for line in lines)
