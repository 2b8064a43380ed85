"""wrap(): turning existing objects into pipelines."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from mixprec import pipelines


def _small_ddpm():
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(
        sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
        block_out_channels=(8, 16), norm_num_groups=4,
        down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
    )
    pipe = DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=10))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _run_ddpm(obj, inputs):
    result = obj(
        batch_size=inputs["batch_size"],
        generator=torch.Generator().manual_seed(inputs["seed"]),
        num_inference_steps=2,
        output_type="np",
    )
    return torch.from_numpy(result.images).permute(0, 3, 1, 2)


def test_wrap_diffusers_pipeline():
    ddpm = _small_ddpm()
    pipe = pipelines.wrap(
        ddpm,
        run=_run_ddpm,
        example_inputs=lambda batch, seed: {"batch_size": batch, "seed": seed},
    )
    assert pipe.name == "ddpmpipeline"
    assert pipe.output_kind == "image"
    assert list(pipe.components) == ["unet"]
    assert pipe.components["unet"] is ddpm.unet
    assert pipe.parameter_counts()["total"] == sum(p.numel() for p in ddpm.unet.parameters())
    out = pipe.run(pipe.example_inputs(2, 0))
    assert isinstance(out, pipelines.ImageOutput)
    assert out.images.shape == (2, 3, 8, 8)
    assert torch.equal(out.images, pipe.run(pipe.example_inputs(2, 0)).images)
    with pytest.raises(ValueError, match="batch"):
        pipe.example_inputs(0, 0)


class _Plain:
    def __init__(self):
        self.encoder = nn.Linear(4, 8)
        self.scale = 2.0
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(8, 3))
        self.alias = self.encoder  # same module twice: kept once
        self._hidden = nn.Linear(2, 2)  # private: ignored

    def __call__(self, x):
        return self.head(self.encoder(x)) * self.scale


def test_wrap_plain_object_uses_attribute_order_and_default_call():
    obj = _Plain()
    pipe = pipelines.wrap(
        obj,
        name="plain",
        output_kind="embedding",
        example_inputs=lambda batch, seed: torch.randn(
            batch, 4, generator=torch.Generator().manual_seed(seed)
        ),
        sensitive=("head.1", "type:Linear"),
    )
    assert list(pipe.components) == ["encoder", "head"]
    assert pipe.parameter_counts() == {"encoder": 40, "head": 27, "total": 67}
    assert pipe.resolve_hints() == ["encoder", "head.1"]
    out = pipe.run(pipe.example_inputs(3, 1))
    assert isinstance(out, pipelines.EmbeddingOutput)
    assert out.embeddings.shape == (3, 3)
    assert torch.is_inference(out.embeddings)


def test_wrap_module_and_errors():
    model = nn.Linear(2, 2)
    pipe = pipelines.wrap(model, output_kind="embedding")
    assert pipe.components == {"model": model}
    with pytest.raises(NotImplementedError, match="example_inputs"):
        pipe.example_inputs(1, 0)
    assert pipe.run(torch.ones(1, 2)).output.shape == (1, 2)
    with pytest.raises(ValueError, match="no torch.nn.Module"):
        pipelines.wrap(object(), output_kind="image")
    with pytest.raises(ValueError, match="output_kind must be one of audio, image, embedding"):
        pipelines.wrap(_Plain(), output_kind="video")
    with pytest.raises(ValueError, match="output_kind"):
        pipelines.wrap(_Plain())
    with pytest.raises(ValueError, match="sample_rate"):
        pipelines.wrap(_Plain(), output_kind="audio")
    audio = pipelines.wrap(_Plain(), output_kind="audio", sample_rate=16000)
    assert audio.sample_rate == 16000
    out = audio.run(torch.ones(1, 4))
    assert out.sample_rate == 16000


def test_wrapped_run_must_return_a_tensor():
    pipe = pipelines.wrap(_Plain(), output_kind="image", run=lambda obj, inputs: "nope")
    with pytest.raises(ValueError, match="expected a tensor"):
        pipe.run(None)
