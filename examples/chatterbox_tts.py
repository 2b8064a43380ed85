"""Chatterbox TTS (Resemble AI) as a mixprec pipeline: the real model classes, the app's real flow.

A factory for ``--pipeline``::

    mixprec explain --pipeline examples/chatterbox_tts.py:pipeline --size test --preset memory
    CHATTERBOX_CKPT_DIR=~/chatterbox mixprec run --pipeline examples/chatterbox_tts.py:pipeline --out hello.wav
    CHATTERBOX_CKPT_DIR=~/chatterbox mixprec bench --pipeline examples/chatterbox_tts.py:pipeline

or from Python::

    from mixprec import pipelines
    pipe = pipelines.get("examples/chatterbox_tts.py:pipeline", size="test")
    ref = pipe.run(pipe.example_inputs(batch=1, seed=0))

The components are the package's own modules (``pip install chatterbox-tts``):

* ``t3`` - ``chatterbox.models.t3.T3``, the Llama text-to-speech-token model;
* ``s3gen`` - ``chatterbox.models.s3gen.S3Gen``: the S3 speech tokenizer, the
  CAMPPlus speaker encoder, the flow-matching mel decoder and the HiFT vocoder;
* ``ve`` - ``chatterbox.models.voice_encoder.VoiceEncoder``, the speaker embedding LSTM.

With ``ckpt_dir`` (or the ``CHATTERBOX_CKPT_DIR`` environment variable) naming a
folder with ``ve.safetensors``, ``t3_cfg.safetensors`` and ``s3gen.safetensors``
(and optionally ``tokenizer.json`` and ``conds.pt``), the real weights are loaded
as ``ChatterboxTTS.from_local`` loads them.  Without it the same classes are
built with seeded random weights: nothing is downloaded.

:meth:`ChatterboxPipeline.run` does what ``ChatterboxTTS.generate`` does with an
audio prompt: conditionals from the reference (``s3gen.embed_ref``, the prompt
speech tokens from ``s3gen.tokenizer``, ``ve.embeds_from_wavs``), ``T3Cond``,
``t3.inference`` with classifier-free guidance (sampling), dropping the tokens
S3Gen cannot render, then ``s3gen.inference`` to a 24 kHz waveform.  The
watermarker is left out (``perth`` is optional).  Every random draw is seeded:
two runs of the same inputs at the same precision give identical audio.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mixprec.pipelines import AudioOutput, Pipeline

__all__ = ["SIZES", "ChatterboxInputs", "ChatterboxPipeline", "ChatterboxSize", "pipeline"]

#: Sample rate of the reference audio the tokenizer and voice encoder take.
S3_SR = 16_000
#: Sample rate of the generated audio.
S3GEN_SR = 24_000
#: Speech tokens below this id are renderable by S3Gen; the rest are T3's special tokens.
SPEECH_VOCAB_SIZE = 6561
#: T3's text vocabulary (English) and its start / stop text tokens.
TEXT_VOCAB, START_TEXT, STOP_TEXT = 704, 255, 0
#: Name under which the small T3 backbone of size "test" is registered.
TEST_LLAMA = "Llama_520M_mixprec_test"
#: The longest reference S3Gen conditions on (``ChatterboxTTS.DEC_COND_LEN``), in seconds.
MAX_REFERENCE_S = 10.0

SENTENCES: tuple[str, ...] = (
    "Reduced precision can make speech synthesis twice as fast.",
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "Thank you for calling, how may I help you today?",
    "The weather today is sunny with a light breeze from the west.",
)


@dataclass(frozen=True)
class ChatterboxSize:
    """What a size changes; S3Gen and the voice encoder have one size only.

    Attributes:
        llama_layers: Layers of T3's Llama backbone (``None``: Llama_520M's 30).
        llama_intermediate: Its MLP width (``None``: Llama_520M's 4096).
        max_new_tokens: Speech tokens T3 may generate without real weights; with
            real weights the app's 1000 (it stops at its stop token).
        n_cfm_timesteps: Euler steps of the flow decoder (``None``: S3Gen's 10).
        reference_s: Seconds of the synthetic reference voice.
        text_tokens: Random text tokens per example (when no tokenizer is loaded).
    """

    llama_layers: int | None
    llama_intermediate: int | None
    max_new_tokens: int
    n_cfm_timesteps: int | None
    reference_s: float
    text_tokens: int


#: ``"full"`` is the released model; ``"test"`` a 2-layer T3 and short runs for tests.
SIZES: dict[str, ChatterboxSize] = {
    "full": ChatterboxSize(None, None, max_new_tokens=100, n_cfm_timesteps=None, reference_s=6.0,
                           text_tokens=40),
    "test": ChatterboxSize(2, 1024, max_new_tokens=12, n_cfm_timesteps=2, reference_s=1.0, text_tokens=12),
}


@dataclass(frozen=True)
class ChatterboxInputs:
    """Inputs of :class:`ChatterboxPipeline` (from :meth:`ChatterboxPipeline.example_inputs`).

    Attributes:
        text_tokens: ``(batch, n)`` T3 text token ids without start / stop tokens,
            right-padded with -1 when the texts differ in length.
        reference_wav: ``(batch, samples)`` 16 kHz reference voices, or ``None``
            to use the built-in voice of ``conds.pt``.
        seed: Seed of T3's sampling and S3Gen's noise (item ``i`` uses ``seed + i``).
        texts: The sentences behind ``text_tokens`` (empty for random tokens).
        speech_tokens: ``(batch, n)`` speech tokens of a reference run to
            teacher-force T3 with (see :meth:`ChatterboxPipeline.teacher_forced`).
    """

    text_tokens: torch.Tensor
    reference_wav: torch.Tensor | None
    seed: int
    texts: tuple[str, ...] = ()
    speech_tokens: torch.Tensor | None = None


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device | None = None) -> Iterator[None]:
    """Seed torch's generators inside the block; the caller's state is restored after."""
    devices = []
    if device is not None and device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed % (2**63))
        yield


@contextlib.contextmanager
def _quiet_sampling() -> Iterator[None]:
    """Hide ``t3.inference``'s per-token progress bar (it would flood benchmark logs)."""
    from chatterbox.models.t3 import t3 as t3_module

    original = t3_module.tqdm
    t3_module.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        t3_module.tqdm = original


def _register_test_llama() -> str:
    from chatterbox.models.t3.llama_configs import LLAMA_CONFIGS

    test = SIZES["test"]
    LLAMA_CONFIGS.setdefault(TEST_LLAMA, {
        **LLAMA_CONFIGS["Llama_520M"],
        "num_hidden_layers": test.llama_layers,
        # hidden_size stays 1024: the perceiver resampler's LayerNorm is built for it
        "intermediate_size": test.llama_intermediate,
    })
    return TEST_LLAMA


def synthetic_voice(seconds: float, generator: torch.Generator) -> torch.Tensor:
    """A seeded voice-like 16 kHz waveform: a gliding pitch, eight harmonics, syllable rhythm, noise.

    Args:
        seconds: Length.
        generator: Source of the pitch, phases and noise.

    Returns:
        ``(samples,)`` float32 with peak 0.5.
    """
    n = int(round(seconds * S3_SR))
    t = torch.arange(n, dtype=torch.float64) / S3_SR
    rand = lambda *shape: torch.rand(shape, generator=generator, dtype=torch.float64)  # noqa: E731
    f0 = 95.0 + 120.0 * rand(1) + 12.0 * torch.sin(2 * math.pi * (0.5 + rand(1)) * t)
    phase = 2 * math.pi * torch.cumsum(f0 / S3_SR, dim=0)
    harmonics = sum((0.6 ** k) * torch.sin(k * phase + 2 * math.pi * rand(1)) for k in range(1, 9))
    rhythm = 0.6 + 0.4 * torch.sin(2 * math.pi * (3.0 + 2.0 * rand(1)) * t + 2 * math.pi * rand(1))
    noise = 0.02 * torch.randn(n, generator=generator, dtype=torch.float64)
    wave = harmonics * rhythm + noise
    return (0.5 * wave / wave.abs().max()).float()


class ChatterboxPipeline(Pipeline):
    """Chatterbox TTS with its real classes (see the module docstring).

    Teacher forcing (how ``token_agreement`` is measured): ``run(inputs,
    speech_tokens=ref.speech_tokens)`` replays a reference run's speech tokens
    instead of sampling new ones, so a reduced-precision run renders exactly the
    tokens the fp32 run chose and the waveforms can be compared sample by sample.
    T3 still runs its full KV-cached decoding loop, the same operations as
    ``T3.inference``; at every step it draws a token the way ``T3.inference``
    does (CFG, repetition penalty, temperature, min-p, top-p, then
    ``torch.multinomial``) from the same seeded random stream, then feeds the
    forced token instead.  ``token_agreement`` is the fraction of steps where
    the drawn token equals the forced one: the share of tokens this precision
    would have sampled identically given the same random numbers.
    ``torch.multinomial`` consumes the same amount of randomness at every step
    whatever the probabilities, so the random streams stay aligned after a step
    that disagrees.  An fp32 run forced with its own tokens scores exactly 1.0.

    Args:
        t3: The T3 model.
        s3gen: The S3Gen model.
        ve: The voice encoder.
        size: The :class:`ChatterboxSize` the run lengths come from.
        max_new_tokens: Most speech tokens T3 generates per item.
        tokenizer: ``EnTokenizer`` for real sentences, or ``None`` for random text tokens.
        builtin_conds: ``Conditionals`` from ``conds.pt`` (used when the inputs
            carry no reference waveform), or ``None``.
        voice: ``None`` (a seeded synthetic voice per example), ``"builtin"``
            (``builtin_conds``) or the path of an audio file (loaded at 16 kHz).
        device: Device of the components.
    """

    name = "chatterbox"
    output_kind = "audio"
    sample_rate = S3GEN_SR
    sensitive = (
        "type:LayerNorm",
        "type:LlamaRMSNorm",
        "type:BatchNorm1d",
        "type:BatchNorm2d",
        "t3.speech_head",
        "t3.cond_enc.spkr_enc",
        "s3gen.tokenizer.quantizer.*",
        # S3Gen casts its inputs to the dtype of this first flow parameter (S3Gen.dtype): the
        # reference waveform, and the prompt token ids, which bf16 rounds above 256 (4099 -> 4096)
        "s3gen.flow.input_embedding",
        "s3gen.flow.spk_embed_affine_layer",
        "s3gen.mel2wav.m_source.*",
        "s3gen.mel2wav.f0_predictor.*",
        "s3gen.mel2wav.conv_post",
        "ve.lstm",
        "ve.proj",
    )

    #: Sampling settings of ``ChatterboxTTS.generate``.
    exaggeration: float = 0.5
    cfg_weight: float = 0.5
    temperature: float = 0.8
    repetition_penalty: float = 1.2
    min_p: float = 0.05
    top_p: float = 1.0

    def __init__(
        self,
        t3: torch.nn.Module,
        s3gen: torch.nn.Module,
        ve: torch.nn.Module,
        *,
        size: ChatterboxSize,
        max_new_tokens: int,
        tokenizer: Any = None,
        builtin_conds: Any = None,
        voice: str | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        self.size = size
        self.max_new_tokens = max_new_tokens
        self.tokenizer = tokenizer
        self.builtin_conds = builtin_conds
        self.voice = voice
        super().__init__({"t3": t3, "s3gen": s3gen, "ve": ve}, device=device)

    # ------------------------------------------------------------------ inputs
    def _example_inputs(self, batch: int, seed: int) -> ChatterboxInputs:
        generator = torch.Generator().manual_seed(seed % (2**63))
        chooser = random.Random(seed)
        if self.tokenizer is not None:
            texts = tuple(chooser.choice(SENTENCES) for _ in range(batch))
            rows = [self.tokenizer.text_to_tokens(_punc_norm(t))[0] for t in texts]
            longest = max(len(r) for r in rows)
            text_tokens = torch.full((batch, longest), -1, dtype=torch.long)
            for i, row in enumerate(rows):
                text_tokens[i, : len(row)] = row
        else:
            texts = ()
            # ids 1..703 without the start token (255); 0 is the stop token
            ids = torch.randint(1, TEXT_VOCAB - 1, (batch, self.size.text_tokens), generator=generator)
            text_tokens = ids + (ids >= START_TEXT).long()
        if self.voice == "builtin":
            reference = None
        elif self.voice:
            import librosa

            wave, _ = librosa.load(self.voice, sr=S3_SR, duration=MAX_REFERENCE_S)
            reference = torch.from_numpy(wave).float().expand(batch, -1).clone()
        else:
            reference = torch.stack([synthetic_voice(self.size.reference_s, generator) for _ in range(batch)])
        return ChatterboxInputs(text_tokens=text_tokens, reference_wav=reference, seed=seed, texts=texts)

    def teacher_forced(self, inputs: ChatterboxInputs, reference: AudioOutput) -> ChatterboxInputs:
        """Return ``inputs`` with the speech tokens of ``reference`` to force (see the class docstring)."""
        if reference.speech_tokens is None:
            raise ValueError("reference output has no speech_tokens to teacher-force with")
        return dataclasses.replace(inputs, speech_tokens=reference.speech_tokens)

    # ------------------------------------------------------------------ run
    def _run(self, inputs: ChatterboxInputs, *, speech_tokens: torch.Tensor | None = None) -> AudioOutput:
        if not isinstance(inputs, ChatterboxInputs):
            raise ValueError(f"chatterbox inputs must be ChatterboxInputs, got {type(inputs).__name__}")
        batch = inputs.text_tokens.shape[0]
        forced = inputs.speech_tokens if speech_tokens is None else speech_tokens
        if forced is not None:
            forced = self._check_forced(forced, batch)
        waves, tokens, matches, steps = [], [], 0, 0
        with _quiet_sampling():
            for item in range(batch):
                seed = inputs.seed + item
                t3_cond, gen_ref = self._conditionals(inputs, item)
                text = inputs.text_tokens[item]
                text = text[text >= 0][None].to(self.device)
                text = torch.cat([text, text], dim=0)  # two sequences for classifier-free guidance
                text = F.pad(F.pad(text, (1, 0), value=START_TEXT), (0, 1), value=STOP_TEXT)
                with _seeded(seed, self.device):
                    if forced is None:
                        raw = self.components["t3"].inference(
                            t3_cond=t3_cond, text_tokens=text, max_new_tokens=self.max_new_tokens,
                            temperature=self.temperature, cfg_weight=self.cfg_weight,
                            repetition_penalty=self.repetition_penalty, min_p=self.min_p, top_p=self.top_p,
                        )[0]
                    else:
                        row = forced[item]
                        raw, agreed = self._forced_decode(t3_cond, text, row[row >= 0].to(self.device))
                        matches, steps = matches + agreed, steps + raw.numel()
                valid = raw[raw < SPEECH_VOCAB_SIZE]  # what ChatterboxTTS.generate keeps
                if valid.numel() == 0:
                    raise RuntimeError(
                        f"T3 produced no renderable speech token for item {item} "
                        f"({raw.numel()} tokens, all >= {SPEECH_VOCAB_SIZE})"
                    )
                with _seeded(seed, self.device):  # the flow decoder and the vocoder draw noise
                    wave, _ = self.components["s3gen"].inference(
                        speech_tokens=valid, ref_dict=gen_ref, n_cfm_timesteps=self.size.n_cfm_timesteps,
                    )
                waves.append(wave[0].float())
                tokens.append(raw)
        output = torch.zeros((batch, max(w.numel() for w in waves)), device=self.device)
        speech = torch.full((batch, max(t.numel() for t in tokens)), -1, dtype=torch.long, device=self.device)
        for item, (wave, raw) in enumerate(zip(waves, tokens)):
            output[item, : wave.numel()] = wave
            speech[item, : raw.numel()] = raw
        return AudioOutput(
            output=output, sample_rate=S3GEN_SR, speech_tokens=speech,
            token_agreement=None if forced is None else matches / max(steps, 1),
        )

    def _conditionals(self, inputs: ChatterboxInputs, item: int) -> tuple[Any, dict[str, Any]]:
        """``(T3Cond, S3Gen reference dict)`` as ``ChatterboxTTS.prepare_conditionals`` makes them."""
        from chatterbox.models.t3.modules.cond_enc import T3Cond

        t3, s3gen, ve = self.components["t3"], self.components["s3gen"], self.components["ve"]
        if inputs.reference_wav is None:
            if self.builtin_conds is None:
                raise ValueError("inputs without a reference_wav need the built-in voice of conds.pt; "
                                 "pass ckpt_dir= with a conds.pt, or use voice=None")
            conds = self.builtin_conds
            t3_cond = T3Cond(speaker_emb=conds.t3.speaker_emb,
                             cond_prompt_speech_tokens=conds.t3.cond_prompt_speech_tokens,
                             emotion_adv=self.exaggeration * torch.ones(1, 1, 1)).to(device=self.device)
            return t3_cond, {k: (v.clone() if torch.is_tensor(v) else v) for k, v in conds.gen.items()}
        reference = inputs.reference_wav[item]
        reference = reference[: int(MAX_REFERENCE_S * S3_SR)]
        gen_ref = s3gen.embed_ref(reference[None], S3_SR, device=self.device)
        prompt_tokens = None
        if plen := t3.hp.speech_cond_prompt_len:
            wav_16k = reference[: 6 * S3_SR].cpu().numpy()  # ChatterboxTTS.ENC_COND_LEN
            prompt_tokens, _ = s3gen.tokenizer.forward([wav_16k], max_len=plen)
            prompt_tokens = torch.atleast_2d(prompt_tokens).to(self.device)
        speaker = torch.from_numpy(ve.embeds_from_wavs([reference.cpu().numpy()], sample_rate=S3_SR))
        speaker = speaker.mean(dim=0, keepdim=True).to(self.device)
        t3_cond = T3Cond(speaker_emb=speaker, cond_prompt_speech_tokens=prompt_tokens,
                         emotion_adv=self.exaggeration * torch.ones(1, 1, 1)).to(device=self.device)
        return t3_cond, gen_ref

    def _check_forced(self, forced: torch.Tensor, batch: int) -> torch.Tensor:
        vocab = self.components["t3"].hp.speech_tokens_dict_size
        if forced.dim() != 2 or forced.shape[0] != batch or forced.dtype != torch.long:
            raise ValueError(
                f"speech_tokens must be an int64 tensor of shape (batch={batch}, n), "
                f"got {forced.dtype} {tuple(forced.shape)}"
            )
        if int(forced.max()) >= vocab or bool(((forced >= 0).sum(dim=1) == 0).any()):
            raise ValueError(f"speech_tokens must hold ids in [0, {vocab}) (-1 pads), at least one per item")
        return forced

    def _forced_decode(self, t3_cond: Any, text_tokens: torch.Tensor, forced: torch.Tensor) -> tuple[torch.Tensor, int]:
        """``T3.inference``'s decoding loop fed ``forced`` tokens; returns them and the steps that agreed."""
        from chatterbox.models.t3.inference.t3_hf_backend import T3HuggingfaceBackend
        from transformers.generation.logits_process import (
            MinPLogitsWarper,
            RepetitionPenaltyLogitsProcessor,
            TopPLogitsWarper,
        )

        t3 = self.components["t3"]
        hp = t3.hp
        text_tokens = torch.atleast_2d(text_tokens).to(dtype=torch.long, device=t3.device)
        initial = hp.start_speech_token * torch.ones_like(text_tokens[:, :1])
        embeds, _ = t3.prepare_input_embeds(
            t3_cond=t3_cond, text_tokens=text_tokens, speech_tokens=initial, cfg_weight=self.cfg_weight,
        )
        model = T3HuggingfaceBackend(config=t3.cfg, llama=t3.tfmr, speech_enc=t3.speech_emb,
                                     speech_head=t3.speech_head, alignment_stream_analyzer=None)
        device = embeds.device
        bos = torch.tensor([[hp.start_speech_token]], dtype=torch.long, device=device)
        bos_embed = t3.speech_emb(bos) + t3.speech_pos_emb.get_fixed_embedding(0)
        inputs_embeds = torch.cat([embeds, torch.cat([bos_embed, bos_embed])], dim=1)
        generated = bos.clone()
        min_p = MinPLogitsWarper(min_p=self.min_p)
        top_p = TopPLogitsWarper(top_p=self.top_p)
        penalty = RepetitionPenaltyLogitsProcessor(penalty=float(self.repetition_penalty))
        output = model(inputs_embeds=inputs_embeds, past_key_values=None, use_cache=True,
                       output_attentions=True, output_hidden_states=True, return_dict=True)
        past = output.past_key_values
        agreed, fed = 0, 0
        for i in range(forced.numel()):
            step = output.logits[:, -1, :]
            cond, uncond = step[0:1, :], step[1:2, :]
            cfg = torch.as_tensor(self.cfg_weight, device=cond.device, dtype=cond.dtype)
            logits = cond + cfg * (cond - uncond)
            ids = generated[:1, ...]
            logits = penalty(ids, logits)
            if self.temperature != 1.0:
                logits = logits / self.temperature
            logits = top_p(ids, min_p(ids, logits))
            drawn = torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)
            token = forced[i].view(1, 1)
            agreed += int(drawn.item() == token.item())
            generated = torch.cat([generated, token], dim=1)
            fed += 1
            if token.item() == hp.stop_speech_token:
                break
            embed = t3.speech_emb(token) + t3.speech_pos_emb.get_fixed_embedding(i + 1)
            output = model(inputs_embeds=torch.cat([embed, embed]), past_key_values=past,
                           output_attentions=True, output_hidden_states=True, return_dict=True)
            past = output.past_key_values
        return forced[:fed], agreed


def _punc_norm(text: str) -> str:
    from chatterbox.tts import punc_norm

    return punc_norm(text)


def _load_weights(ckpt_dir: Path, t3: torch.nn.Module, s3gen: torch.nn.Module, ve: torch.nn.Module) -> tuple[Any, Any]:
    """Load the checkpoint as ``ChatterboxTTS.from_local`` does; returns ``(tokenizer, conds)``."""
    from safetensors.torch import load_file

    ve.load_state_dict(load_file(ckpt_dir / "ve.safetensors"))
    t3_state = load_file(ckpt_dir / "t3_cfg.safetensors")
    if "model" in t3_state.keys():
        t3_state = t3_state["model"][0]
    t3.load_state_dict(t3_state)
    s3gen.load_state_dict(load_file(ckpt_dir / "s3gen.safetensors"), strict=False)
    tokenizer = conds = None
    if (ckpt_dir / "tokenizer.json").exists():
        from chatterbox.models.tokenizers import EnTokenizer

        tokenizer = EnTokenizer(str(ckpt_dir / "tokenizer.json"))
    if (ckpt_dir / "conds.pt").exists():
        from chatterbox.tts import Conditionals

        conds = Conditionals.load(ckpt_dir / "conds.pt", map_location="cpu")
    return tokenizer, conds


_WEIGHT_FILES = ("ve.safetensors", "t3_cfg.safetensors", "s3gen.safetensors")


def _checkpoint(ckpt_dir: str | os.PathLike | None, size: str) -> Path | None:
    """The checkpoint folder to load (argument, else ``CHATTERBOX_CKPT_DIR``), checked; ``None``: random weights."""
    source = "ckpt_dir"
    if ckpt_dir is None and os.environ.get("CHATTERBOX_CKPT_DIR"):
        ckpt_dir, source = os.environ["CHATTERBOX_CKPT_DIR"], "CHATTERBOX_CKPT_DIR"
    if ckpt_dir is None or str(ckpt_dir) == "":
        return None
    path = Path(ckpt_dir).expanduser()
    if size == "test":
        raise ValueError(
            f"{source}={str(ckpt_dir)!r} holds the full model, but size 'test' builds a 2-layer T3 "
            "the real weights do not fit; use size 'full' (or unset the checkpoint for random weights)"
        )
    if not path.is_dir():
        raise ValueError(f"{source}={str(ckpt_dir)!r} is not a folder")
    missing = [name for name in _WEIGHT_FILES if not (path / name).is_file()]
    if missing:
        raise ValueError(
            f"{source}={str(ckpt_dir)!r} lacks {', '.join(missing)}; a Chatterbox checkpoint folder holds "
            f"{', '.join(_WEIGHT_FILES)} (and optionally tokenizer.json, conds.pt)"
        )
    return path


def pipeline(
    size: str = "full",
    ckpt_dir: str | os.PathLike | None = None,
    seed: int = 0,
    *,
    device: str | torch.device = "cpu",
    voice: str | None = None,
    max_new_tokens: int | None = None,
) -> ChatterboxPipeline:
    """Build the Chatterbox pipeline (the factory ``--pipeline examples/chatterbox_tts.py:pipeline`` calls).

    Args:
        size: ``"full"`` (the released architecture; ``"default"`` is the same)
            or ``"test"`` (T3 with a 2-layer, 1024-wide Llama; short runs).
        ckpt_dir: Folder of the real weights (``ve.safetensors``,
            ``t3_cfg.safetensors``, ``s3gen.safetensors``, optionally
            ``tokenizer.json`` for real sentences and ``conds.pt`` for the
            built-in voice); default ``$CHATTERBOX_CKPT_DIR``; none: seeded random weights.
        seed: Seed of the random weights (ignored when weights are loaded).
        device: Device of the components.
        voice: Reference voice: ``None`` (default ``$CHATTERBOX_VOICE``, else a
            seeded synthetic voice), ``"builtin"`` (``conds.pt``), or an audio file.
        max_new_tokens: Most speech tokens per item (default: 1000 with real
            weights, as the app; else the size's, 100 or 12).

    Raises:
        ValueError: For an unknown size, a checkpoint folder that lacks weight
            files, real weights with size ``"test"``, ``voice="builtin"``
            without ``conds.pt``, or a voice file that does not exist.
    """
    from chatterbox.models.s3gen import S3Gen
    from chatterbox.models.t3 import T3
    from chatterbox.models.t3.modules.t3_config import T3Config
    from chatterbox.models.voice_encoder import VoiceEncoder

    key = "full" if size == "default" else size
    if key not in SIZES:
        raise ValueError(f"unknown chatterbox size {size!r}; valid sizes: full (or default), test")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if max_new_tokens is not None and (isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int)
                                       or max_new_tokens < 1):
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    checkpoint = _checkpoint(ckpt_dir, key)
    voice = voice if voice is not None else (os.environ.get("CHATTERBOX_VOICE") or None)
    if voice not in (None, "builtin") and not Path(voice).expanduser().is_file():
        raise ValueError(f"voice {voice!r} is neither 'builtin' nor an existing audio file")
    hp = T3Config.english_only()
    if key == "test":
        hp.llama_config_name = _register_test_llama()
    with _seeded(seed):
        t3, s3gen, ve = T3(hp), S3Gen(), VoiceEncoder()
    tokenizer = conds = None
    if checkpoint is not None:
        tokenizer, conds = _load_weights(checkpoint, t3, s3gen, ve)
    if voice == "builtin" and conds is None:
        raise ValueError("voice='builtin' needs conds.pt in the checkpoint folder (ckpt_dir / CHATTERBOX_CKPT_DIR)")
    if max_new_tokens is None:
        max_new_tokens = 1000 if checkpoint is not None else SIZES[key].max_new_tokens
    return ChatterboxPipeline(
        t3, s3gen, ve, size=SIZES[key], max_new_tokens=max_new_tokens, tokenizer=tokenizer,
        builtin_conds=conds, voice=None if voice is None else (voice if voice == "builtin" else str(Path(voice).expanduser())),
        device=device,
    )
