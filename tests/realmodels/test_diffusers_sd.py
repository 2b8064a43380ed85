"""A diffusers ``StableDiffusionPipeline`` under every policy, applied to the pipeline object.

Assembled from a small ``UNet2DConditionModel`` (8x8 latents), ``AutoencoderKL`` (4x:
32x32 images), ``CLIPTextModel`` and ``DDIMScheduler``, all seeded. The
``CLIPTokenizer`` is built in memory (byte-level vocabulary, no merges), so the prompt
goes through the real tokenizer and text encoder and nothing is downloaded. Two DDIM
steps with classifier-free guidance, ``output_type="pt"``.

``mixprec.apply(pipe, policy)`` gets the pipeline itself: docs/policies.md ("nn.Module,
{name: module} or a pipeline") and ``components_of`` ("a pipeline gives
``pipeline.components``"). A diffusers pipeline's ``components`` also holds the
tokenizer, the scheduler and ``None`` for absent optional parts
(``safety_checker``, ``feature_extractor``, ``image_encoder``); the desired behaviour
is that the policy applies to its ``nn.Module`` components and leaves the others be.
"""

from __future__ import annotations

import pytest
import torch

from realmodels_harness import Case, check_combination, check_guarded, combos, compare_waveform

PROMPT = "a red bicycle"  # 13 byte-level tokens + start and end: fits the 16 positions
SIZE = 32


def _tokenizer():
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for suffix in ("", "</w>"):
        for c in chars:
            vocab[c + suffix] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=16)


def _pipeline():
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = _tokenizer()
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        max_position_embeddings=16, projection_dim=32, bos_token_id=0, eos_token_id=1, pad_token_id=1)).eval()
    unet = UNet2DConditionModel(
        sample_size=SIZE // 4, in_channels=4, out_channels=4, block_out_channels=(32, 64), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8).eval()
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 16, 16),
        down_block_types=("DownEncoderBlock2D",) * 3, up_block_types=("UpDecoderBlock2D",) * 3,
        layers_per_block=1, norm_num_groups=8, sample_size=SIZE).eval()
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                   scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _case(target_of) -> Case:
    pipe = _pipeline()
    modules = {k: v for k, v in pipe.components.items() if isinstance(v, torch.nn.Module)}
    assert set(modules) == {"vae", "text_encoder", "unet"}

    def run():
        generator = torch.Generator().manual_seed(0)
        return pipe(PROMPT, num_inference_steps=2, height=SIZE, width=SIZE, guidance_scale=5.0,
                    generator=generator, output_type="pt").images

    def compare(ref, out, tier):
        metrics = compare_waveform(ref, out, tier, "image")
        mse = (ref.double() - out.double()).pow(2).mean().item()
        metrics["image_psnr_db"] = float("inf") if mse == 0 else 10 * torch.log10(torch.tensor(1.0 / mse)).item()
        return metrics

    case = Case(target_of(pipe, modules), modules, run, compare).record_reference()
    case.state["pipe"] = pipe
    return case


@pytest.fixture(scope="module")
def sd() -> Case:
    return _case(lambda pipe, modules: pipe)


@pytest.fixture(scope="module")
def sd_mapping() -> Case:
    return _case(lambda pipe, modules: modules)


def test_sd_reference_is_an_image(sd):
    image = sd.reference
    assert image.shape == (1, 3, SIZE, SIZE) and image.dtype == torch.float32
    assert 0.0 <= image.min() and image.max() <= 1.0 and image.std() > 0.01


# The slowest combination (every module emulated bf16, ~ bf16-native plus matmul "medium").
@pytest.mark.parametrize(("policy", "hw"), combos(heavy={("fast", "bf16-fast")}), indirect=["hw"])
def test_sd_pipeline(sd, policy, hw, record_property):
    check_combination(sd, policy, hw, record_property)


@pytest.mark.parametrize(("policy", "hw"), [
    pytest.param("bf16-native", "measured", id="bf16-native-measured"),
    pytest.param("memory", "measured", id="memory-measured", marks=pytest.mark.heavy),
    pytest.param("fp16-storage-fp32-compute", "measured", id="fp16-storage-fp32-compute-measured", marks=pytest.mark.heavy),
    pytest.param("balanced", "bf16-fast", id="balanced-bf16-fast", marks=pytest.mark.heavy),
], indirect=["hw"])
def test_sd_components_mapping(sd_mapping, policy, hw, record_property):
    """The same pipeline with its nn.Module components passed as a mapping (the route that
    works whatever ``components_of`` does with the pipeline object)."""
    check_combination(sd_mapping, policy, hw, record_property)


@pytest.mark.parametrize(("policy", "hw"), [("fp8", "measured")], indirect=["hw"])
def test_sd_pipeline_guarded(sd, policy, hw, record_property):
    check_guarded(sd, policy, hw, record_property)
