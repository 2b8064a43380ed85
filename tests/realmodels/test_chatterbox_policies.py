"""The real Chatterbox classes (chatterbox-tts 0.1.7) under every policy, through the app's whole flow.

Each run is the example pipeline's ``run`` (examples/chatterbox_tts.py): conditionals from
a reference voice (``S3Gen.embed_ref``, the S3 speech tokenizer called through
``.forward``, the voice encoder), ``T3.inference`` teacher-forced on the fp32 run's speech
tokens, ``S3Gen.inference`` to a 24 kHz waveform. The policy is applied with
``mixprec.apply`` and watched by ``mixprec.guard(on_nonfinite="fallback")``; no pin may
be a whole component, revert must be bit-exact and no torch flag may move.

bf16 is emulated on CPUs without AVX512-BF16 (about 1/50 of fp32's speed), so most
combinations that compute in bf16 are ``heavy`` (``MIXPREC_HEAVY=1``); the default run
keeps three (see ``LIGHT``).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

pytest.importorskip("chatterbox.models.t3", reason="chatterbox-tts is not installed")

from realmodels_harness import Case, check_combination, combos, compare_waveform  # noqa: E402

# By default: the memory preset on this machine's probe, the explicit fp16-storage /
# fp32-compute policy, and bf16 everywhere (where the two dtype mismatches first seen on
# Chatterbox were: a dataclass-carried speaker embedding, and harmonics made in fp32
# inside the vocoder's forward).
LIGHT = {("memory", "measured"), ("fp16-storage-fp32-compute", "measured"), ("bf16-native", "measured"), ("fp8", "measured")}


#: The run lengths (the test size's are 12 tokens, 2 flow steps, a 1 s voice): every component
#: still runs, on shorter inputs. In bf16 one run computes about 32 GFLOP this way against 76,
#: most of it in S3Gen, whose architecture has one size (tests/_flops16.py counts it).
MAX_NEW_TOKENS, FLOW_STEPS, REFERENCE_S = 6, 1, 0.5


@pytest.fixture(scope="module")
def chatterbox(chatterbox_pipeline) -> Case:
    # The session's test-size pipeline (conftest.py), its run lengths shortened on a copy: the
    # modules are the same objects, the example's tests keep their own lengths.
    pipe = copy.copy(chatterbox_pipeline)
    pipe.max_new_tokens = MAX_NEW_TOKENS
    pipe.size = dataclasses.replace(pipe.size, n_cfm_timesteps=FLOW_STEPS, reference_s=REFERENCE_S)
    inputs = pipe.example_inputs(batch=1, seed=0)
    with torch.inference_mode():
        first = pipe.run(inputs)  # the app fills some buffers lazily on its first call
    forced = pipe.teacher_forced(inputs, first)

    def run():
        return pipe.run(forced)

    def compare(ref, out, tier):
        metrics = compare_waveform(ref.waveform, out.waveform, tier)
        metrics["token_agreement"] = out.token_agreement
        assert out.token_agreement is not None and out.token_agreement >= 0.5, out.token_agreement
        return metrics

    return Case(pipe, dict(pipe.components), run, compare).record_reference()


def _params():
    out = []
    for param in combos():
        policy, probe = param.values
        light = (policy, probe) in LIGHT
        out.append(pytest.param(policy, probe, marks=() if light else (pytest.mark.heavy,), id=param.id))
    return out


@pytest.mark.parametrize(("policy", "hw"), _params(), indirect=["hw"])
def test_chatterbox_app_flow(chatterbox, policy, hw, record_property):
    metrics = check_combination(chatterbox, policy, hw, record_property, guard=True)
    assert metrics["token_agreement"] >= 0.5
