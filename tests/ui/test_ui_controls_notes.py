"""The precision controls as a source of settings: typed values read as every source's words are,
and what the configuration sources held and did not use shown in the status."""

from __future__ import annotations

import pytest

gr = pytest.importorskip("gradio")

import torch  # noqa: E402

import mixprec  # noqa: E402
from mixprec.ui.controls import build_policy, defaults_message, initialize_service, precision_controls  # noqa: E402


@pytest.mark.parametrize("typed", ["MEDIUM", " medium\u00a0", "me\u200bdium", "ｍｅｄｉｕｍ"])
def test_a_typed_matmul_value_is_read_as_the_word_it_shows(typed, clean_env, restore_flags):
    message = initialize_service(None, matmul=typed, lang="en")
    assert torch.get_float32_matmul_precision() == "medium", message
    assert "float32 matmul precision = medium" in message


def test_a_look_alike_matmul_value_is_refused_with_it_escaped(clean_env, restore_flags):
    before = mixprec.describe()
    message = initialize_service(None, matmul="m\u0435dium", lang="en")
    assert "m\\u0435dium" in message and "highest, high, medium" in message
    assert mixprec.describe() == before


def test_preset_and_types_are_read_as_words(clean_env):
    assert build_policy(preset=" FAST\u00a0").name == "fast"
    assert build_policy(dtypes={"t3": "BF16\u200b"}).rules[0].storage == "bf16"


@pytest.mark.parametrize("lang", ["en", "he"])
def test_the_status_says_what_the_sources_held_and_did_not_use(lang, clean_env, restore_flags):
    clean_env.setenv("ace_step_float32_matmul_precision", "medium")
    clean_env.setenv("ACE_STEP_PRESET", "fast\u00a0")
    with gr.Blocks():
        controls = precision_controls("ACE_STEP", lang=lang)
    for status in (controls.status.value, defaults_message("ACE_STEP", lang),
                   initialize_service("ACE_STEP", matmul="high", lang=lang)):
        assert status.count("not used: 'ace_step_float32_matmul_precision' (env): names are matched in upper case: "
                            "write ACE_STEP_FLOAT32_MATMUL_PRECISION") == 1, status
        assert status.count("value 'fast\\xa0' read as 'fast'") == 1
    assert torch.get_float32_matmul_precision() == "high"
