"""``tts``: a Chatterbox-shaped text-to-speech pipeline with random, seeded weights.

Components, in the order ``run`` uses them:

* ``ve`` - voice encoder (LSTM) turning a reference mel into a speaker embedding;
* ``t3_cond`` - text and speaker prefix embeddings for the backbone;
* ``t3`` - a ``transformers.LlamaForCausalLM`` whose vocabulary is the speech
  tokens; it generates a fixed number of tokens greedily with a KV cache;
* ``s3gen`` - flow-matching decoder from speech tokens to an 80-bin mel;
* ``vocoder`` - HiFi-GAN generator from mel to a 24 kHz waveform.

There is no stop token: every run generates exactly ``num_tokens`` tokens so
that the work done per run does not depend on the numbers.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import torch

from mixprec._kv_cache import cache_keyword, output_cache
from mixprec.pipelines._base import (
    AudioOutput,
    Pipeline,
    make_generator,
    module_dtype,
    sized_config,
    seeded,
)

__all__ = ["SIZES", "SIZE_NOTES", "TTSConfig", "TTSInputs", "TTSPipeline", "build"]

_ALPHABET = " abcdefghijklmnopqrstuvwxyz0123456789'.,;:?!-\""
_PAD, _UNK = 0, 1

SENTENCES: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things.",
    "Reduced precision can make inference twice as fast.",
    "She sells sea shells by the sea shore.",
    "How much wood would a woodchuck chuck?",
    "The weather today is sunny with a light breeze.",
    "Turn left at the next intersection, then keep straight.",
    "Thank you for calling, how may I help you?",
)


@dataclass(frozen=True)
class TTSConfig:
    """Sizes of the tts pipeline (see :data:`SIZES`)."""

    text_len: int = 48
    spk_dim: int = 256
    ve_mels: int = 40
    ve_hidden: int = 256
    ve_layers: int = 3
    ref_frames: int = 160
    t3_hidden: int = 1024
    t3_layers: int = 6
    t3_heads: int = 16
    t3_intermediate: int = 2816
    n_speech_tokens: int = 6561
    num_tokens: int = 50
    n_mels: int = 80
    s3_dim: int = 512
    s3_heads: int = 8
    s3_encoder_layers: int = 4
    s3_estimator_layers: int = 6
    flow_steps: int = 10
    cfg_rate: float = 0.7
    frames_per_token: int = 2
    voc_channels: int = 512
    voc_upsample: tuple[int, ...] = (8, 5, 4, 3)
    voc_kernels: tuple[int, ...] = (3, 7, 11)
    voc_dilations: tuple[int, ...] = (1, 3, 5)


#: Named sizes: ``"default"`` for benchmarks on a CPU, ``"test"`` for the test suite,
#: ``"large"`` (Chatterbox's scale) for benchmarks on a GPU.
SIZES: dict[str, TTSConfig] = {
    "default": TTSConfig(),
    "test": TTSConfig(
        text_len=16, spk_dim=32, ve_mels=40, ve_hidden=32, ve_layers=1, ref_frames=20,
        t3_hidden=64, t3_layers=2, t3_heads=4, t3_intermediate=128, n_speech_tokens=256,
        num_tokens=8, s3_dim=32, s3_heads=2, s3_encoder_layers=1, s3_estimator_layers=2,
        flow_steps=2, voc_channels=32, voc_kernels=(3, 7), voc_dilations=(1, 3),
    ),
    # Chatterbox: the 0.5B Llama T3 (30 x 1024, MLP 4096, 16 heads), 100 speech tokens (4 s);
    # the flow decoder as deep as S3Gen's (10 encoder blocks, 6 conformer + 4 after upsampling,
    # and 16 estimator blocks for its 4 down/up + 12 mid blocks) at its encoder's width 512;
    # the voice encoder, the 10 flow steps and the 512-channel vocoder are Chatterbox's already.
    "large": TTSConfig(
        t3_layers=30, t3_intermediate=4096, num_tokens=100,
        s3_encoder_layers=10, s3_estimator_layers=16,
    ),
}

#: What each size is for (``mixprec pipelines`` prints it).
SIZE_NOTES: dict[str, str] = {
    "default": "benchmarks on a 2-core CPU: a 6-layer T3, 50 speech tokens (2 s of audio)",
    "test": "the test suite: tiny, 8 speech tokens",
    "large": "benchmarks on a GPU: Chatterbox scale (0.5B Llama T3, 30 x 1024), 100 speech tokens "
    "(4 s of audio)",
}


@dataclass(frozen=True)
class TTSInputs:
    """Inputs of :class:`TTSPipeline`.

    Attributes:
        text_ids: ``(batch, text_len)`` character ids, padded with 0.
        reference_mel: ``(batch, frames, ve_mels)`` mel the speaker is taken from.
        seed: Seed of the flow-matching noise.
        texts: The sentences behind ``text_ids``.
        speech_tokens: Optional ``(batch, n)`` tokens of a reference run; when
            set, t3 is teacher-forced with them.
    """

    text_ids: torch.Tensor
    reference_mel: torch.Tensor
    seed: int
    texts: tuple[str, ...] = ()
    speech_tokens: torch.Tensor | None = None


def encode_text(text: str, length: int) -> list[int]:
    """Character ids of ``text`` (lower-cased), truncated or padded to ``length``."""
    ids = [_ALPHABET.index(c) + 2 if c in _ALPHABET else _UNK for c in text.lower()]
    return (ids + [_PAD] * length)[:length]


class TTSPipeline(Pipeline):
    """Chatterbox-shaped text-to-speech (see the module docstring)."""

    name = "tts"
    output_kind = "audio"
    sample_rate = 24000
    work_option = ("num_tokens", 10)
    # The logits that choose each speech token, and the waveform's last projection. Pinning
    # any one of the norms, the speaker projection, the flow's time MLP or output projection
    # or the vocoder's first convolution moved the teacher-forced waveform's SQNR by less
    # than 0.1 dB in bf16 and in fp16 (38.0 / 56.2 dB), so they are not claimed.
    sensitive = (
        "t3.lm_head",
        "vocoder.conv_post",
    )

    def __init__(
        self, config: TTSConfig, *, seed: int = 0, device: str | torch.device = "cpu"
    ) -> None:
        from transformers import LlamaConfig, LlamaForCausalLM

        from mixprec.pipelines._tts_modules import (
            FlowDecoder,
            HiFiGANVocoder,
            T3Conditioner,
            VoiceEncoder,
        )

        self.config = config
        self.seed = seed
        vocab = config.n_speech_tokens + 2  # + start and stop of speech
        llama_config = LlamaConfig(
            vocab_size=vocab,
            hidden_size=config.t3_hidden,
            intermediate_size=config.t3_intermediate,
            num_hidden_layers=config.t3_layers,
            num_attention_heads=config.t3_heads,
            num_key_value_heads=config.t3_heads,
            max_position_embeddings=1 + config.text_len + config.num_tokens + 64,
            tie_word_embeddings=False,
            bos_token_id=config.n_speech_tokens,
            eos_token_id=config.n_speech_tokens + 1,
            pad_token_id=None,
        )
        with seeded(seed):
            components = {
                "ve": VoiceEncoder(
                    n_mels=config.ve_mels, hidden=config.ve_hidden,
                    layers=config.ve_layers, embed_dim=config.spk_dim,
                ),
                "t3_cond": T3Conditioner(
                    text_vocab=len(_ALPHABET) + 2, max_text_len=config.text_len,
                    spk_dim=config.spk_dim, hidden=config.t3_hidden,
                ),
                "t3": LlamaForCausalLM(llama_config),
                "s3gen": FlowDecoder(
                    vocab=config.n_speech_tokens, n_mels=config.n_mels, spk_dim=config.spk_dim,
                    dim=config.s3_dim, heads=config.s3_heads,
                    encoder_layers=config.s3_encoder_layers,
                    estimator_layers=config.s3_estimator_layers,
                    frames_per_token=config.frames_per_token,
                ),
                "vocoder": HiFiGANVocoder(
                    n_mels=config.n_mels, channels=config.voc_channels,
                    upsample_rates=config.voc_upsample, kernels=config.voc_kernels,
                    dilations=config.voc_dilations,
                ),
            }
        super().__init__(components, device=device)

    def _example_inputs(self, batch: int, seed: int) -> TTSInputs:
        cfg = self.config
        chooser = random.Random(seed)
        texts = tuple(chooser.choice(SENTENCES) for _ in range(batch))
        text_ids = torch.tensor([encode_text(t, cfg.text_len) for t in texts], dtype=torch.long)
        generator = make_generator(seed)
        reference_mel = torch.randn((batch, cfg.ref_frames, cfg.ve_mels), generator=generator)
        return TTSInputs(text_ids=text_ids, reference_mel=reference_mel, seed=seed, texts=texts)

    def teacher_forced(self, inputs: TTSInputs, reference: AudioOutput) -> TTSInputs:
        """Return ``inputs`` with the speech tokens of ``reference`` to force."""
        if reference.speech_tokens is None:
            raise ValueError("reference output has no speech_tokens to teacher-force with")
        return dataclasses.replace(inputs, speech_tokens=reference.speech_tokens)

    def _run(
        self, inputs: TTSInputs, *, speech_tokens: torch.Tensor | None = None
    ) -> AudioOutput:
        if not isinstance(inputs, TTSInputs):
            raise ValueError(f"tts inputs must be TTSInputs, got {type(inputs).__name__}")
        forced = inputs.speech_tokens if speech_tokens is None else speech_tokens.to(self.device)
        batch = inputs.text_ids.shape[0]
        if forced is not None:
            self._check_forced(forced, batch)
        parts = self.components
        speaker = parts["ve"](inputs.reference_mel)
        tokens, agreement = self._generate(speaker, inputs.text_ids, forced)
        frames = tokens.shape[1] * self.config.frames_per_token
        noise = torch.randn(
            (batch, frames, self.config.n_mels), generator=make_generator(inputs.seed)
        )
        mel = parts["s3gen"](
            tokens, speaker, noise.to(self.device),
            steps=self.config.flow_steps, cfg_rate=self.config.cfg_rate,
        )
        waveform = parts["vocoder"](mel)
        return AudioOutput(
            output=waveform, sample_rate=self.sample_rate,
            speech_tokens=tokens, token_agreement=agreement,
        )

    def _check_forced(self, forced: torch.Tensor, batch: int) -> None:
        n_speech = self.config.n_speech_tokens
        if forced.dim() != 2 or forced.shape[0] != batch or forced.shape[1] < 1:
            raise ValueError(
                f"speech_tokens must have shape (batch={batch}, n>=1), got {tuple(forced.shape)}"
            )
        if forced.dtype != torch.long or int(forced.min()) < 0 or int(forced.max()) >= n_speech:
            raise ValueError(f"speech_tokens must be int64 ids in [0, {n_speech})")

    def _generate(
        self, speaker: torch.Tensor, text_ids: torch.Tensor, forced: torch.Tensor | None
    ) -> tuple[torch.Tensor, float | None]:
        """Greedy autoregressive decoding with a KV cache (teacher-forced if ``forced``)."""
        t3 = self.components["t3"]
        n_speech = self.config.n_speech_tokens
        steps = self.config.num_tokens if forced is None else forced.shape[1]
        batch = text_ids.shape[0]
        start = torch.full((batch, 1), n_speech, dtype=torch.long, device=self.device)
        prefix = torch.cat(
            [
                self.components["t3_cond"](text_ids, speaker).to(module_dtype(t3)),
                t3.get_input_embeddings()(start),
            ],
            dim=1,
        )
        out = t3(inputs_embeds=prefix, use_cache=True)
        chosen, matches = [], 0
        for step in range(steps):
            # Special tokens (start/stop) are never chosen: exactly `steps` speech tokens.
            choice = out.logits[:, -1, :n_speech].float().argmax(dim=-1)
            if forced is None:
                token = choice
            else:
                token = forced[:, step]
                matches += int((choice == token).sum())
            chosen.append(token)
            if step == steps - 1:
                break
            out = t3(input_ids=token[:, None], use_cache=True, **{cache_keyword(t3): output_cache(out)})
        agreement = None if forced is None else matches / (batch * steps)
        return torch.stack(chosen, dim=1), agreement


def build(
    *, size: str = "default", seed: int = 0, device: str | torch.device = "cpu", **overrides: object
) -> TTSPipeline:
    """Build the ``tts`` pipeline.

    Args:
        size: A key of :data:`SIZES`.
        seed: Seed of the weight initialisation.
        device: Device of the components.
        **overrides: Fields of :class:`TTSConfig` to change, e.g. ``num_tokens=100``.

    Raises:
        ValueError: For an unknown size or override name.
    """
    return TTSPipeline(sized_config("tts", SIZES, size, overrides), seed=seed, device=device)
