"""The protocol every built-in pipeline follows."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from mixprec import pipelines
from mixprec.pipelines import OUTPUT_KINDS, Pipeline, PipelineOutput, UnknownPipelineError

BUILTINS = ("tts", "diffusion", "minilm")


def test_import_is_light_and_leaves_torch_settings_alone():
    code = (
        "import sys, torch\n"
        "before = (torch.get_num_threads(), torch.get_float32_matmul_precision(),"
        " torch.get_default_dtype())\n"
        "import mixprec.pipelines as p\n"
        "p.available()\n"
        "heavy = sorted(m for m in sys.modules\n"
        "               if m.split('.')[0] in ('transformers', 'diffusers'))\n"
        "after = (torch.get_num_threads(), torch.get_float32_matmul_precision(),"
        " torch.get_default_dtype())\n"
        "print(heavy, before == after)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "[] True"


def test_builtins_are_available():
    assert set(BUILTINS) <= set(pipelines.available())


@pytest.mark.parametrize("name", BUILTINS)
def test_pipeline_shape_of_protocol(built, name):
    pipe = built[name]
    assert isinstance(pipe, Pipeline)
    assert pipe.name == name
    assert pipe.output_kind in OUTPUT_KINDS
    assert isinstance(pipe.components, dict) and pipe.components
    assert all(isinstance(m, nn.Module) for m in pipe.components.values())
    assert pipe.device == torch.device("cpu")
    assert pipe.to("cpu") is pipe
    if pipe.output_kind == "audio":
        assert pipe.sample_rate == 24000


@pytest.mark.parametrize("name", BUILTINS)
def test_parameter_counts(built, name):
    pipe = built[name]
    counts = pipe.parameter_counts()
    assert list(counts)[:-1] == list(pipe.components)
    params = [p for m in pipe.components.values() for p in m.parameters()]
    assert counts["total"] == sum(p.numel() for p in params)
    assert all(isinstance(v, int) and v > 0 for v in counts.values())


@pytest.mark.parametrize("name", BUILTINS)
def test_every_sensitive_hint_matches_a_module(built, name):
    pipe = built[name]
    assert pipe.sensitive
    for hint in pipe.sensitive:
        assert pipe.resolve_hints([hint]), f"{name}: hint {hint!r} matches nothing"
    names = dict(pipe.named_modules())
    assert all(n in names for n in pipe.resolve_hints())


@pytest.mark.parametrize("name", BUILTINS)
def test_inputs_hold_no_modules_and_outputs_are_float32(built, name):
    pipe = built[name]
    inputs = pipe.example_inputs(1, 3)
    values = vars(inputs).values() if hasattr(inputs, "__dict__") else inputs.values()
    assert not any(isinstance(v, nn.Module) for v in values)
    out = pipe.run(inputs)
    assert isinstance(out, PipelineOutput)
    assert out.output.dtype == torch.float32 and torch.isfinite(out.output).all()


@pytest.mark.parametrize("name", BUILTINS)
@pytest.mark.parametrize("batch", [0, -1, 1.5, "2", True, None])
def test_invalid_batch_is_rejected(built, name, batch):
    with pytest.raises(ValueError, match="batch"):
        built[name].example_inputs(batch, 0)


@pytest.mark.parametrize("seed", ["x", 1.0, False, None])
def test_invalid_seed_is_rejected(tts, seed):
    with pytest.raises(ValueError, match="seed"):
        tts.example_inputs(1, seed)


def test_invalid_seed_for_get():
    with pytest.raises(ValueError, match="seed"):
        pipelines.get("tts", size="test", seed="x")


def test_unknown_pipeline_lists_available_and_suggests():
    with pytest.raises(UnknownPipelineError) as info:
        pipelines.get("tsst")
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert all(name in message for name in BUILTINS)
    assert "Did you mean 'tts'?" in message


@pytest.mark.parametrize("name", BUILTINS)
def test_unknown_size_and_option(name):
    with pytest.raises(ValueError, match="huge.*valid sizes: default, test"):
        pipelines.get(name, size="huge")
    with pytest.raises(ValueError, match="bogus_option"):
        pipelines.get(name, size="test", bogus_option=1)


@pytest.mark.parametrize("name", BUILTINS)
def test_components_run_in_reduced_precision(name):
    pipe = pipelines.get(name, size="test", seed=0)
    inputs = pipe.example_inputs(2, 0)
    reference = pipe.run(inputs)
    for module in pipe.components.values():
        module.to(torch.bfloat16)
    out = pipe.run(pipe.teacher_forced(inputs, reference))
    assert out.output.dtype == torch.float32
    assert out.output.shape == reference.output.shape
    assert torch.isfinite(out.output).all()
    assert not torch.equal(out.output, reference.output)


def test_global_rng_untouched_by_build_and_run():
    state = torch.random.get_rng_state()
    pipe = pipelines.get("tts", size="test", seed=5)
    pipe.run(pipe.example_inputs(1, 5))
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("seed", [-5, 2**70])
def test_any_int_seed_is_accepted(seed):
    pipe = pipelines.get("tts", size="test", seed=seed)
    first = pipe.run(pipe.example_inputs(1, seed)).waveform
    assert torch.equal(first, pipe.run(pipe.example_inputs(1, seed)).waveform)
