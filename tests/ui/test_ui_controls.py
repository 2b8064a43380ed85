"""The embeddable precision controls and their handler."""

from __future__ import annotations

import pytest

gr = pytest.importorskip("gradio")

import torch  # noqa: E402

import mixprec  # noqa: E402
from mixprec.ui import controls  # noqa: E402
from mixprec.ui.controls import build_policy, initialize_service, precision_controls  # noqa: E402


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


class TestPresetsShowWhatTheySet:
    """Under a preset the selectors show its weight types and the matmul dropdown its level."""

    @pytest.mark.parametrize("preset", list(mixprec.PRESETS))
    def test_component_types_are_the_preset_s(self, preset, bf16_cpu):
        from mixprec import pipelines
        from mixprec.policy.select import resolve_modules

        pipe = pipelines.get("tts", size="test", seed=0)
        given = controls.preset_storage(preset, pipe.components, tuple(pipe.sensitive))
        plans, _ = resolve_modules(dict(pipe.components), mixprec.preset(preset, hints=tuple(pipe.sensitive)))
        assert set(given) == set(pipe.components)
        for name, (main, others) in given.items():
            weighed = {}
            for plan in plans:
                if plan.qualname == name or plan.qualname.startswith(f"{name}."):
                    count = sum(p.numel() for p in plan.module.parameters(recurse=False))
                    weighed[plan.storage] = weighed.get(plan.storage, 0) + count
                    assert (plan.qualname in others) == (count > 0 and plan.storage != main)
            assert weighed[main] == max(weighed.values())
            update = controls.dtype_selector_update(preset, "en", (main, others))
            assert update["value"] == main and update["interactive"] is False
            assert (str(len(others)) in update["info"]) == bool(others)
        if preset == "memory":
            assert {main for main, _ in given.values()} != {"fp32"}

    @pytest.mark.parametrize("preset", [controls.NO_PRESET, *mixprec.PRESETS])
    def test_matmul_follows_the_preset_and_an_override_is_said(self, preset, clean_env, restore_flags):
        level = controls.preset_matmul(preset)
        update = controls.matmul_update(None, preset, "en")
        if level is None:
            assert update["value"] == controls.default_matmul(None)[0]
            assert update["info"] == controls.matmul_info(None, "en")
        else:
            assert update["value"] == level == mixprec.preset(preset).numerics.matmul
            assert f'The preset "{preset}" sets {level}' in update["info"]
        for chosen in mixprec.MATMUL_LEVELS:
            status = initialize_service(None, matmul=chosen, preset=preset, lang="en")
            said = f"overrides the {level} of the preset" in status
            assert said == (level is not None and chosen != level), status
