"""MusicGen (text to music), VITS and SpeechT5 + HiFi-GAN (text to speech) under every policy.

Tiny seeded models; see ``realmodels_harness`` for what each combination checks.

* MusicGen: T5 text encoder, MusicGen decoder (2 codebooks) and EnCodec audio encoder;
  greedy generation of a few audio frames with classifier-free guidance (MusicGen's
  default, scale 3), decoded to a waveform by EnCodec. The codes are compared like
  tokens (guided scores on the fp32 prefix, agreement reported);
  inside the block the fp32 run's codes are also decoded with the policy applied,
  so the decoder's waveform is compared sample by sample even when a code flipped.
* VITS: text ids to waveform. The deterministic duration predictor is used and its
  output projection scaled so every token lasts ~2.5 -> 3 frames: durations go
  through ``ceil``, and a duration one frame longer in bf16 would change the
  waveform's length and make a sample-wise comparison meaningless.
* SpeechT5: ``generate_speech`` with the HiFi-GAN vocoder, ``threshold=2`` so the
  stop head never fires and every run produces the same number of frames. Its
  decoder prenet applies dropout at inference (by design), so each run is seeded.
"""

from __future__ import annotations

import math

import pytest
import torch

from realmodels_harness import Case, check_combination, combos, compare_generation, compare_waveform

TEXT = torch.tensor([[5, 9, 23, 42, 7, 30, 12, 1]])


# --- MusicGen ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def musicgen() -> Case:
    from transformers import (EncodecConfig, MusicgenConfig, MusicgenDecoderConfig,
                              MusicgenForConditionalGeneration, T5Config)

    torch.manual_seed(0)
    text = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                    relative_attention_num_buckets=8)
    # 800 Hz, 16x upsampling: 50 frames/s; 1 kbps at 50 frames/s = 2 codebooks of 64 codes.
    audio = EncodecConfig(hidden_size=16, num_filters=4, codebook_size=64, codebook_dim=16, upsampling_ratios=[4, 4],
                          num_lstm_layers=1, sampling_rate=800, target_bandwidths=[1.0], audio_channels=1)
    decoder = MusicgenDecoderConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
                                    num_codebooks=2, max_position_embeddings=64, pad_token_id=64, bos_token_id=64,
                                    initializer_factor=0.5)
    model = MusicgenForConditionalGeneration(MusicgenConfig(text_encoder=text, audio_encoder=audio, decoder=decoder)).eval()
    case_state: dict = {}
    original_decode = model.audio_encoder.decode

    def recording_decode(audio_codes, *args, **kwargs):
        # Records the audio codes generate() hands to EnCodec (generate returns only audio).
        case_state["codes"] = audio_codes.clone()
        return original_decode(audio_codes, *args, **kwargs)

    def run():
        model.audio_encoder.__dict__["decode"] = recording_decode
        try:
            out = model.generate(input_ids=TEXT, attention_mask=torch.ones_like(TEXT), max_new_tokens=8, do_sample=False,
                                 guidance_scale=3.0, output_scores=True, return_dict_in_generate=True)
        finally:
            del model.audio_encoder.__dict__["decode"]
        return {"gen": out, "audio": out.sequences, "codes": case_state.pop("codes")}

    def compare(ref, out, tier):
        metrics = compare_generation(ref["gen"], out["gen"], tier, vocab_size=decoder.vocab_size,
                                     tokens_ref=ref["codes"], tokens_out=out["codes"], attr="scores")
        if torch.equal(ref["codes"], out["codes"]):
            metrics.update(compare_waveform(ref["audio"], out["audio"], tier, "audio"))
        else:  # different codes: a different (valid) piece of audio; same shape and finite
            assert out["audio"].shape == ref["audio"].shape and torch.isfinite(out["audio"]).all()
        return metrics

    def inside(case, tier):
        # Teacher-forced decode: the fp32 run's codes through the policy's EnCodec.
        audio_out = model.audio_encoder.decode(case.reference["codes"], [None]).audio_values
        return compare_waveform(case.reference["audio"], audio_out, tier, "decoded")

    return Case(model, {"": model}, run, compare, inside=inside).record_reference()


def test_musicgen_reference_is_audio(musicgen):
    codes, audio = musicgen.reference["codes"], musicgen.reference["audio"]
    assert codes.shape[:3] == (1, 1, 2) and codes.shape[-1] >= 4, codes.shape
    assert audio.shape[:2] == (1, 1) and audio.shape[-1] == codes.shape[-1] * 16, (audio.shape, codes.shape)
    assert audio.abs().max() > 0 and len(torch.unique(codes)) >= 3


# The slowest combination (every module emulated bf16, ~ bf16-native plus matmul "medium").
@pytest.mark.parametrize(("policy", "hw"), combos(heavy={("fast", "bf16-fast")}), indirect=["hw"])
def test_musicgen_text_to_music(musicgen, policy, hw, record_property):
    check_combination(musicgen, policy, hw, record_property)


# --- VITS -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vits() -> Case:
    from transformers import VitsConfig, VitsModel

    torch.manual_seed(0)
    config = VitsConfig(
        vocab_size=38, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, ffn_dim=64, flow_size=16,
        spectrogram_bins=33, upsample_initial_channel=32, upsample_rates=[4, 4], upsample_kernel_sizes=[8, 8],
        resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3]], use_stochastic_duration_prediction=False,
        duration_predictor_filter_channels=32, prior_encoder_num_flows=2, prior_encoder_num_wavenet_layers=2,
        posterior_encoder_num_wavenet_layers=2, depth_separable_num_layers=2, noise_scale=0.667, layerdrop=0.0,
    )
    model = VitsModel(config).eval()
    with torch.no_grad():  # durations ~2.5 frames -> ceil 3, far from a rounding edge (see module docstring)
        model.duration_predictor.proj.weight.mul_(0.01)
        model.duration_predictor.proj.bias.fill_(math.log(2.5))
    ids = TEXT.clamp(max=config.vocab_size - 1)

    def run():
        torch.manual_seed(1)  # the prior's noise (noise_scale)
        return model(input_ids=ids, attention_mask=torch.ones_like(ids))

    def compare(ref, out, tier):
        assert torch.equal(out.sequence_lengths, ref.sequence_lengths), (out.sequence_lengths, ref.sequence_lengths)
        return compare_waveform(ref.waveform, out.waveform, tier)

    return Case(model, {"": model}, run, compare).record_reference()


def test_vits_reference_durations_are_robust(vits):
    # 8 tokens x 3 frames x 16 samples per frame.
    assert vits.reference.waveform.shape == (1, 8 * 3 * 16)
    assert vits.reference.waveform.abs().max() > 0


@pytest.mark.parametrize(("policy", "hw"), combos(), indirect=["hw"])
def test_vits_text_to_speech(vits, policy, hw, record_property):
    check_combination(vits, policy, hw, record_property)


# --- SpeechT5 + HiFi-GAN --------------------------------------------------------------

@pytest.fixture(scope="module")
def speecht5() -> Case:
    from transformers import SpeechT5Config, SpeechT5ForTextToSpeech, SpeechT5HifiGan, SpeechT5HifiGanConfig

    torch.manual_seed(0)
    config = SpeechT5Config(
        vocab_size=64, hidden_size=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
        speech_decoder_prenet_units=32, speech_decoder_postnet_units=32, speech_decoder_postnet_layers=2,
        speaker_embedding_dim=16, reduction_factor=2, max_speech_positions=256, max_text_positions=64,
    )
    model = SpeechT5ForTextToSpeech(config).eval()
    vocoder = SpeechT5HifiGan(SpeechT5HifiGanConfig(
        model_in_dim=16, upsample_initial_channel=32, upsample_rates=[4, 4], upsample_kernel_sizes=[8, 8],
        resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3]])).eval()
    speaker = torch.randn(1, 16, generator=torch.Generator().manual_seed(2))
    tts = torch.nn.ModuleDict({"tts": model, "vocoder": vocoder})

    def run():
        torch.manual_seed(1)  # the prenet's inference-time dropout
        return model.generate_speech(TEXT, speaker, threshold=2.0, minlenratio=0.0, maxlenratio=1.0, vocoder=vocoder)

    def compare(ref, out, tier):
        return compare_waveform(ref, out, tier)

    return Case({"tts": model, "vocoder": vocoder}, {"tts": tts}, run, compare).record_reference()


@pytest.mark.parametrize(("policy", "hw"), combos(), indirect=["hw"])
def test_speecht5_text_to_speech(speecht5, policy, hw, record_property):
    check_combination(speecht5, policy, hw, record_property)
