"""The Stable-Diffusion-shaped diffusion pipeline at test size."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from mixprec import pipelines


@pytest.mark.parametrize("batch", [1, 2])
def test_diffusion_shapes_and_range(diffusion, batch):
    out = diffusion.run(diffusion.example_inputs(batch, 0))
    size = diffusion.image_size
    assert out.images.shape == (batch, 3, size, size)
    assert out.images.min() >= 0.0 and out.images.max() <= 1.0
    assert out.images.std() > 0.02, "image is (nearly) constant"
    saturated = ((out.images == 0) | (out.images == 1)).float().mean()
    assert saturated < 0.5


def test_diffusion_is_deterministic(diffusion):
    inputs = diffusion.example_inputs(2, 11)
    first, second = diffusion.run(inputs), diffusion.run(inputs)
    assert torch.equal(first.images, second.images)
    other = pipelines.get("diffusion", size="test", seed=0)
    assert torch.equal(other.run(other.example_inputs(2, 11)).images, first.images)


def test_diffusion_seed_changes_the_noise(diffusion):
    a = diffusion.run(diffusion.example_inputs(1, 0)).images
    b = diffusion.run(diffusion.example_inputs(1, 1)).images
    assert not torch.equal(a, b)


def test_diffusion_without_guidance_and_real_classes():
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel

    pipe = pipelines.get("diffusion", size="test", seed=0, guidance_scale=1.0, steps=1)
    assert isinstance(pipe.components["text_encoder"], CLIPTextModel)
    assert isinstance(pipe.components["unet"], UNet2DConditionModel)
    assert isinstance(pipe.components["vae"], AutoencoderKL)
    out = pipe.run(pipe.example_inputs(1, 0))
    assert torch.isfinite(out.images).all()


def test_hashing_tokenizer_is_stable():
    from mixprec.pipelines.diffusion import tokenize

    ids = tokenize("A red bicycle!", vocab_size=100, max_length=8)
    assert ids == tokenize("a red bicycle!", vocab_size=100, max_length=8)
    assert len(ids) == 8 and ids[0] == 98 and ids[5] == 99 and ids[-1] == 99
    assert all(0 <= i < 100 for i in ids)


# --------------------------------------------------------------------------- sizes


def test_large_size_is_stable_diffusion_1_5_without_building_weights():
    from mixprec.pipelines._sizes import build_on_meta
    from mixprec.pipelines.diffusion import SIZE_NOTES, SIZES

    large = SIZES["large"]
    # At least what the GPU session measured (shared/gpu/gpu_factories.py: sd15).
    assert (large.text_hidden, large.text_layers, large.text_heads, large.text_intermediate) == (768, 12, 12, 3072)
    assert large.unet_channels == (320, 640, 1280, 1280) and large.unet_head_dim == 8
    assert large.unet_layers_per_block == 2 and large.latent_size == 64 and large.steps == 20
    assert large.vae_channels == (128, 256, 512, 512) and large.vae_layers_per_block == 2
    assert set(SIZE_NOTES) == set(SIZES)
    pipe = build_on_meta("diffusion", size="large")  # shapes only: nothing is allocated
    assert all(p.is_meta for m in pipe.components.values() for p in m.parameters())
    assert pipe.image_size == 512
    counts = pipe.parameter_counts()
    assert 850e6 < counts["unet"] < 870e6  # SD-1.5's UNet: 859.5M
    assert 120e6 < counts["text_encoder"] < 125e6  # CLIP ViT-L/14's text encoder: 123.1M
    assert 1.0e9 < counts["total"] < 1.1e9


# --------------------------------------------------------------------------- teacher forcing


def test_a_run_records_its_latents_and_noise_predictions(diffusion):
    out = diffusion.run(diffusion.example_inputs(2, 3))
    steps, size = diffusion.config.steps, diffusion.config.latent_size
    assert out.latents.shape == out.noise_predictions.shape == (steps, 2, 4, size, size)
    assert out.latents.dtype == out.noise_predictions.dtype == torch.float32


def test_teacher_forced_fp32_run_is_the_free_run(diffusion):
    inputs = diffusion.example_inputs(2, 4)
    reference = diffusion.run(inputs)
    forced = diffusion.run(diffusion.teacher_forced(inputs, reference))
    assert torch.equal(forced.images, reference.images)
    assert torch.equal(forced.noise_predictions, reference.noise_predictions)
    assert torch.equal(forced.latents, reference.latents)
    by_keyword = diffusion.run(inputs, latents=reference.latents)
    assert torch.equal(by_keyword.noise_predictions, reference.noise_predictions)


def test_teacher_forcing_uses_the_given_latents(diffusion):
    inputs = diffusion.example_inputs(1, 0)
    reference = diffusion.run(inputs)
    other = diffusion.run(diffusion.example_inputs(1, 1))
    forced = diffusion.run(inputs, latents=other.latents)
    assert torch.equal(forced.latents, other.latents)
    assert not torch.equal(forced.noise_predictions, reference.noise_predictions)


def test_teacher_forcing_refuses_latents_of_another_shape(diffusion):
    inputs = diffusion.example_inputs(1, 0)
    reference = diffusion.run(inputs)
    with pytest.raises(ValueError, match="latents must be a floating-point tensor of shape"):
        diffusion.run(inputs, latents=reference.latents[:1])
    with pytest.raises(ValueError, match="latents must be"):
        diffusion.run(diffusion.example_inputs(2, 0), latents=reference.latents)
    with pytest.raises(ValueError, match="no latents"):
        diffusion.teacher_forced(inputs, pipelines.ImageOutput(output=reference.images))


# --------------------------------------------------------------------------- the teacher-forced figure


_SEEDS = (0, 1, 2)


def _step_sqnr(pipe, references, policy=None):
    """Step SQNR (dB) of the teacher-forced noise predictions per input seed, under ``policy``."""
    import mixprec
    from mixprec.measure.metrics import step_quality

    context = mixprec.apply(pipe, policy) if policy is not None else contextlib.nullcontext()
    with context:
        runs = {seed: pipe.run(pipe.teacher_forced(inputs, ref)) for seed, (inputs, ref) in references.items()}
    return [step_quality(runs[seed].noise_predictions, references[seed][1].noise_predictions)["step_sqnr_db"]
            for seed in _SEEDS]


def test_teacher_forced_step_sqnr_orders_configurations_as_their_arithmetic():
    """fp32 exact; fp16 storage with fp32 compute > fp16 > bf16, each gap wider than the
    spread between seeds; perturbed weights far below. Deterministic: CPU, fixed seeds, and
    torch.set_float32_matmul_precision left as it is."""
    import mixprec

    pipe = pipelines.get("diffusion", size="test", seed=0)
    references = {}
    for seed in _SEEDS:
        inputs = pipe.example_inputs(1, seed)
        references[seed] = (inputs, pipe.run(inputs))

    def policy(**rule):
        return mixprec.Policy((mixprec.Rule("*", **rule),))

    fp32 = _step_sqnr(pipe, references, policy(storage="fp32"))
    assert fp32 == [math.inf] * len(_SEEDS)
    figures = {
        "fp16 storage, fp32 compute": _step_sqnr(pipe, references, policy(storage="fp16", compute="fp32")),
        "fp16": _step_sqnr(pipe, references, policy(storage="fp16")),
        "bf16": _step_sqnr(pipe, references, policy(storage="bf16")),
    }
    broken = pipelines.get("diffusion", size="test", seed=0)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for param in broken.components["unet"].parameters():
            param.mul_(1 + 0.05 * torch.randn(param.shape, generator=generator))
    figures["perturbed weights"] = _step_sqnr(broken, references)

    names = list(figures)
    for name, values in figures.items():
        assert all(math.isfinite(v) for v in values), (name, values)
    for better, worse in zip(names, names[1:]):
        hi, lo = figures[better], figures[worse]
        spread = max(max(hi) - min(hi), max(lo) - min(lo))
        gap = min(hi) - max(lo)
        assert gap > spread, f"{better} {hi} vs {worse} {lo}: gap {gap:.1f} dB, seed spread {spread:.1f} dB"
    assert max(figures["perturbed weights"]) < min(figures["bf16"]) - 10, figures
