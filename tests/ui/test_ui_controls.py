"""The embeddable precision controls and their handler."""

from __future__ import annotations

import pytest

gr = pytest.importorskip("gradio")

import torch  # noqa: E402

import mixprec  # noqa: E402
from mixprec.ui import controls  # noqa: E402
from mixprec.ui.controls import build_policy, initialize_service, precision_controls  # noqa: E402


@pytest.fixture
def restore_flags():
    before = mixprec.snapshot()
    yield
    mixprec.restore(before)


def test_build_inside_blocks(clean_env):
    with gr.Blocks():
        controls = precision_controls("ACE_STEP")
    assert controls.matmul.choices and [v for _, v in controls.matmul.choices] == list(mixprec.MATMUL_LEVELS)
    assert controls.preset.value == "none"
    assert controls.dtypes == {}
    assert "default" in controls.status.value


def test_env_var_prefills_default(clean_env):
    clean_env.setenv("ACE_STEP_FLOAT32_MATMUL_PRECISION", "medium")
    with gr.Blocks():
        controls = precision_controls("ACE_STEP", lang="ja")
    assert controls.matmul.value == "medium"
    assert "env ACE_STEP_FLOAT32_MATMUL_PRECISION" in controls.matmul.info
    assert "env ACE_STEP_FLOAT32_MATMUL_PRECISION" in controls.status.value


def test_per_component_selectors():
    class Pipe:
        components = {"t3": None, "vocoder": None}

    with gr.Blocks():
        controls = precision_controls(pipeline=Pipe(), lang="he")
    assert list(controls.dtypes) == ["t3", "vocoder"]
    assert len(controls.inputs) == 5


def test_initialize_high_applies(clean_env, restore_flags):
    with gr.Blocks():
        controls = precision_controls("ACE_STEP")
    message = controls.initialize("high")
    assert torch.get_float32_matmul_precision() == "high"
    assert "float32 matmul precision = high (from argument float32_matmul_precision=)" in message
    assert "mkldnn_matmul" in message


def test_invalid_value_applies_nothing(clean_env, restore_flags):
    before = mixprec.describe()
    with gr.Blocks():
        controls = precision_controls("ACE_STEP")
    message = controls.initialize("ultra")
    assert "ultra" in message and "highest, high, medium" in message
    assert mixprec.describe() == before


def test_invalid_environment_applies_nothing(clean_env, restore_flags):
    clean_env.setenv("ACE_STEP_FLOAT32_MATMUL_PRECISION", "fastest")
    before = mixprec.describe()
    message = initialize_service("ACE_STEP", matmul="high", lang="zh")
    assert "ACE_STEP_FLOAT32_MATMUL_PRECISION" in message and "未应用" in message
    assert mixprec.describe() == before


def test_invalid_dtype_applies_nothing(clean_env, restore_flags):
    before = mixprec.describe()
    message = initialize_service(None, matmul="medium", dtypes={"t3": "int3"})
    assert "int3" in message
    assert mixprec.describe() == before


def test_build_policy():
    assert build_policy() is None
    assert build_policy(dtypes={"t3": "fp32"}) is None
    policy = build_policy(dtypes={"t3": "bf16", "vocoder": "fp32"}, upcast_attention=True)
    assert [(r.match, r.storage, r.upcast_attention) for r in policy.rules] == [
        ("t3", "bf16", None), ("t3", None, True), ("vocoder", None, True)]
    assert build_policy(preset="fast").name == "fast"
    with pytest.raises(ValueError):
        build_policy(preset="turbo")


def test_matmul_info_names_where_the_default_comes_from(clean_env):
    assert "Built-in default" in controls.matmul_info("ACE_STEP", "en")
    clean_env.setenv("ACE_STEP_FLOAT32_MATMUL_PRECISION", "high")
    assert "env ACE_STEP_FLOAT32_MATMUL_PRECISION" in controls.matmul_info("ACE_STEP", "en")
    assert "ACE_STEP_FLOAT32_MATMUL_PRECISION" in controls.matmul_info("ACE_STEP", "he")
