"""``mixprec.gradio``: the public home of the embeddable precision controls."""

from __future__ import annotations

import pytest

gr = pytest.importorskip("gradio")

import mixprec  # noqa: E402
import mixprec.gradio  # noqa: E402
from mixprec.ui import controls  # noqa: E402


def test_reexports_the_controls():
    assert sorted(mixprec.gradio.__all__) == ["PrecisionControls", "build_policy", "initialize_service", "precision_controls"]
    for name in mixprec.gradio.__all__:  # the functions checked at the door, the class as it is
        exported = getattr(mixprec.gradio, name)
        assert getattr(exported, "__wrapped__", exported) is getattr(controls, name)


def test_precision_controls_in_your_own_blocks(clean_env):
    clean_env.setenv("ACE_STEP_FLOAT32_MATMUL_PRECISION", "medium")
    with gr.Blocks() as demo:
        gr.Markdown("my app")
        placed = mixprec.gradio.precision_controls(app="ACE_STEP")
    assert isinstance(placed, mixprec.gradio.PrecisionControls)
    assert placed.matmul.value == "medium" and "env ACE_STEP_FLOAT32_MATMUL_PRECISION" in placed.status.value
    assert {placed.button._id, placed.status._id} <= set(demo.blocks)
    before = mixprec.snapshot()
    try:
        message = mixprec.gradio.initialize_service("ACE_STEP", matmul="ultra")
        assert "ultra" in message and mixprec.snapshot() == before  # invalid: nothing applied
    finally:
        mixprec.restore(before)


def test_initialize_hands_the_policy_to_the_app_and_undoes_a_failed_load(clean_env):
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    loaded = {}

    def load(policy):
        loaded["applied"] = mixprec.apply(model, policy)
        return "model loaded"

    before = mixprec.snapshot()
    try:
        message = mixprec.gradio.initialize_service("ACE_STEP", matmul="high", preset="memory", on_initialize=load)
        assert "Applied." in message and message.endswith("model loaded")
        assert model[0].weight.dtype in (torch.bfloat16, torch.float16)
        assert mixprec.describe()["float32_matmul_precision"] == "high"
        loaded["applied"].revert()

        mixprec.restore(before)
        calls = []
        message = mixprec.gradio.initialize_service("ACE_STEP", matmul="medium", on_initialize=calls.append)
        assert calls == [None]  # nothing chosen: everything stays fp32

        mixprec.restore(before)

        def broken(policy):
            raise OSError("weights not found: model.safetensors")

        message = mixprec.gradio.initialize_service("ACE_STEP", matmul="medium", on_initialize=broken)
        assert "Not applied." in message and "weights not found" in message
        assert mixprec.snapshot() == before  # the numeric settings were put back
    finally:
        mixprec.restore(before)
