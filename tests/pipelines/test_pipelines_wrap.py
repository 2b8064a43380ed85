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
    undecided = pipelines.wrap(_Plain())  # no longer an error: the first run decides
    assert not undecided.output_kind_known
    with pytest.raises(ValueError, match="output_kind=.*example_inputs="):
        undecided.output_kind  # noqa: B018 - no run yet and no inputs to run it on
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


# -- inferring what wrap() is not told ------------------------------------------------------


def _inputs(shape):
    return lambda batch, seed: torch.randn(batch, *shape, generator=torch.Generator().manual_seed(seed))


class _Speaker:
    """An app object: a model plus the sample rate of what it says."""

    def __init__(self, attr="sr", rate=22050):
        self.net = nn.Linear(4, 6)
        setattr(self, attr, rate)

    def __call__(self, x):
        return self.net(x).flatten(1)


@pytest.mark.parametrize("attr", ["sr", "sample_rate", "sampling_rate"])
def test_sample_rate_attribute_means_audio(attr):
    pipe = pipelines.wrap(_Speaker(attr, 22050), example_inputs=_inputs((4,)))
    assert pipe.output_kind_known and pipe.output_kind == "audio" and pipe.sample_rate == 22050
    out = pipe.run(pipe.example_inputs(2, 0))
    assert isinstance(out, pipelines.AudioOutput) and out.sample_rate == 22050
    assert out.waveform.shape == (2, 6)


class _Vocoder(nn.Module):
    def __init__(self, rate=None):
        super().__init__()
        self.conv = nn.Conv1d(1, 1, 3, padding=1)
        if rate is not None:
            self.config = type("Config", (), {"sampling_rate": rate})()

    def forward(self, x):
        return self.conv(x[:, None]).squeeze(1)


class _Tts:
    def __init__(self, rate=None):
        self.text = nn.Embedding(10, 8)
        self.vocoder = _Vocoder(rate)

    def __call__(self, ids):
        return self.vocoder(self.text(ids).flatten(1))


class _DiffusersLike:
    """Shaped like a diffusers pipeline: its modules in a ``components`` mapping."""

    def __init__(self, with_vocoder):
        self.unet = nn.Linear(2, 2)
        self._parts = {"unet": self.unet, "scheduler": object()}
        if with_vocoder:
            self._parts["vocoder"] = _Vocoder(16000)

    @property
    def components(self):
        return self._parts


def test_vocoder_component_means_audio_at_the_vocoders_rate():
    pipe = pipelines.wrap(_Tts(rate=16000))
    assert pipe.output_kind == "audio" and pipe.sample_rate == 16000
    out = pipe.run(torch.tensor([[1, 2, 3]]))
    assert out.sample_rate == 16000 and out.waveform.shape == (1, 24)
    assert pipelines.wrap(_DiffusersLike(with_vocoder=True)).output_kind == "audio"
    assert pipelines.wrap(_DiffusersLike(with_vocoder=False)).output_kind == "image"


def test_vocoder_without_a_rate_asks_for_sample_rate_only():
    with pytest.raises(ValueError, match=r"has a vocoder \(_Vocoder\).*pass sample_rate="):
        pipelines.wrap(_Tts(rate=None))
    pipe = pipelines.wrap(_Tts(rate=None), sample_rate=8000)
    assert pipe.output_kind == "audio" and pipe.sample_rate == 8000


def _returning(tensor_fn):
    """A module whose output is ``tensor_fn(batch)``, whatever its input."""

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))

        def forward(self, x):
            return tensor_fn(x.shape[0]) * self.scale

    return Model()


@pytest.mark.parametrize(
    ("make", "sample_rate", "kind", "shape"),
    [
        (lambda b: torch.rand(b, 3, 4, 4), None, "image", (2, 3, 4, 4)),
        (lambda b: torch.rand(b, 1, 4, 4), None, "image", (2, 1, 4, 4)),
        (lambda b: torch.rand(b, 4, 4, 4), 16000, "image", (2, 4, 4, 4)),
        (lambda b: torch.rand(b, 5), None, "embedding", (2, 5)),
        (lambda b: torch.rand(b, 100), 16000, "audio", (2, 100)),
        (lambda b: torch.rand(100), 16000, "audio", (1, 100)),  # one waveform becomes (1, samples)
    ],
)
def test_kind_inferred_from_the_first_output(make, sample_rate, kind, shape):
    pipe = pipelines.wrap(_returning(make), sample_rate=sample_rate)
    assert not pipe.output_kind_known
    assert "not yet inferred" in repr(pipe)  # repr does not run the model
    out = pipe.run(torch.zeros(2, 1))
    assert pipe.output_kind == kind and out.output.shape == shape
    assert type(out) is {"image": pipelines.ImageOutput, "audio": pipelines.AudioOutput,
                         "embedding": pipelines.EmbeddingOutput}[kind]
    if kind == "audio":
        assert out.sample_rate == sample_rate


@pytest.mark.parametrize(
    ("make", "sample_rate", "needle"),
    [
        (lambda b: torch.rand(b, 2, 100), None, r"3-D tensor of shape \(2, 2, 100\); pass output_kind="),
        (lambda b: torch.rand(100), None, r"1-D tensor .* pass sample_rate= \(if it is a waveform\) or output_kind="),
        (lambda b: torch.rand(b, 5, 4, 4), None, r"only with 1, 3 or 4 channels in dimension 1, got 5"),
        (lambda b: torch.rand(b, 2, 100), 16000, r"3-D tensor"),
    ],
)
def test_kind_that_cannot_be_told_names_what_is_missing(make, sample_rate, needle):
    pipe = pipelines.wrap(_returning(make), sample_rate=sample_rate)
    with pytest.raises(ValueError, match=needle):
        pipe.run(torch.zeros(2, 1))
    assert not pipe.output_kind_known


def test_reading_the_kind_before_a_run_runs_the_example_inputs_once():
    calls = []

    def run(obj, inputs):
        calls.append(inputs.shape)
        return obj(inputs)

    pipe = pipelines.wrap(nn.Linear(3, 2), run=run, example_inputs=_inputs((3,)))
    assert pipe.output_kind == "embedding" and calls == [(1, 3)]
    assert pipe.output_kind == "embedding" and calls == [(1, 3)]  # decided once


def test_object_example_inputs_method_and_pipeline_output_results():
    class App:
        def __init__(self):
            self.net = nn.Linear(2, 8)

        def example_inputs(self, batch, seed):
            return torch.randn(batch, 2, generator=torch.Generator().manual_seed(seed))

        def __call__(self, x):
            return pipelines.AudioOutput(output=self.net(x), sample_rate=12000)

    pipe = pipelines.wrap(App())
    assert pipe.example_inputs(3, 0).shape == (3, 2)
    assert pipe.output_kind == "audio" and pipe.sample_rate == 12000  # from the AudioOutput it returned


def test_explicit_arguments_win_over_inference():
    pipe = pipelines.wrap(_Speaker("sr", 22050), output_kind="embedding")
    assert pipe.output_kind == "embedding" and pipe.sample_rate is None
    assert pipelines.wrap(_Speaker("sr", 22050), sample_rate=8000).sample_rate == 8000
    audio = pipelines.wrap(_Speaker("sr", 22050), output_kind="audio")
    assert audio.sample_rate == 22050  # the rate is still read from the object
    with pytest.raises(ValueError, match="sample_rate must be a positive int, got -1"):
        pipelines.wrap(_Plain(), sample_rate=-1)
