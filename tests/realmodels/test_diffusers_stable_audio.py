"""diffusers' ``StableAudioPipeline`` (text to audio, a DiT over Oobleck latents) under
every policy, applied to the pipeline object and run through the pipeline's own call.

A different family from the UNet image pipeline: a transformer with grouped-query
attention and rotary embeddings, adaptive layer norms, an Oobleck VAE built from
weight-normed convolutions with Snake activations, a T5 text encoder, a projection
model for the start and end seconds, and the EDM DPM-Solver. Tiny seeded models; the
T5 tokenizer is a word-level ``tokenizers`` object made in memory, so nothing is
downloaded. Two prompts (with classifier-free guidance), four steps, a stereo waveform.
"""

from __future__ import annotations

import pytest
import torch

from realmodels_harness import Case, check_combination, combos, compare_waveform

PROMPT, NEGATIVE = "a calm piano melody with soft strings", "rain"


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = f"{PROMPT} {NEGATIVE}".split()
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(dict.fromkeys(words))}}
    model = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=model, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=16)


def _pipeline():
    from diffusers import AutoencoderOobleck, EDMDPMSolverMultistepScheduler, StableAudioDiTModel, StableAudioPipeline
    from diffusers.pipelines.stable_audio import StableAudioProjectionModel
    from transformers import T5Config, T5EncoderModel

    tokenizer = _tokenizer()
    torch.manual_seed(0)
    text_encoder = T5EncoderModel(T5Config(vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                           num_heads=4)).eval()
    transformer = StableAudioDiTModel(
        sample_size=16, in_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=2,
        num_key_value_attention_heads=1, out_channels=4, cross_attention_dim=16, time_proj_dim=8,
        global_states_input_dim=64, cross_attention_input_dim=32).eval()
    vae = AutoencoderOobleck(encoder_hidden_size=8, downsampling_ratios=[2, 4], channel_multiples=[1, 2],
                             decoder_channels=8, decoder_input_channels=4, audio_channels=2, sampling_rate=800).eval()
    projection = StableAudioProjectionModel(text_encoder_dim=32, conditioning_dim=32, min_value=0, max_value=32).eval()
    scheduler = EDMDPMSolverMultistepScheduler(solver_order=2, prediction_type="v_prediction", sigma_data=1.0,
                                               sigma_schedule="exponential")
    pipe = StableAudioPipeline(vae=vae, text_encoder=text_encoder, projection_model=projection, tokenizer=tokenizer,
                               transformer=transformer, scheduler=scheduler)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def stable_audio() -> Case:
    pytest.importorskip("diffusers")
    with pytest.warns(FutureWarning):  # Oobleck's weight_norm; the model code is used as released
        pipe = _pipeline()
    modules = {k: v for k, v in pipe.components.items() if isinstance(v, torch.nn.Module)}
    assert set(modules) == {"vae", "text_encoder", "projection_model", "transformer"}

    def run():
        generator = torch.Generator().manual_seed(0)
        return pipe(PROMPT, negative_prompt=NEGATIVE, num_inference_steps=4, audio_end_in_s=0.15, guidance_scale=3.0,
                    generator=generator, output_type="pt").audios

    return Case(pipe, modules, run, lambda ref, out, tier: compare_waveform(ref, out, tier)).record_reference()


def test_stable_audio_reference_is_a_stereo_waveform(stable_audio):
    wav = stable_audio.reference
    assert wav.shape == (1, 2, 120) and wav.dtype == torch.float32 and wav.std() > 0


@pytest.mark.parametrize(("policy", "hw"), combos(),
                         indirect=["hw"])
def test_stable_audio_pipeline(stable_audio, policy, hw, record_property):
    check_combination(stable_audio, policy, hw, record_property)


@pytest.mark.parametrize(("policy", "hw"), [("bf16-native", "measured"), ("memory", "bf16-fast")], indirect=["hw"])
def test_stable_audio_pipeline_under_the_guard(stable_audio, policy, hw, record_property):
    check_combination(stable_audio, policy, hw, record_property, guard=True)
