"""ACE-Step (text and lyrics to music) as a mixprec pipeline, built from its own classes.

`ACE-Step <https://github.com/ace-step/ACE-Step>`_ by ACE Studio and StepFun. Components:
``text_encoder_model`` (``UMT5EncoderModel``), ``ace_step_transformer``
(``ACEStepTransformer2DModel``: a linear-attention DiT with a Conformer lyric encoder)
and ``music_dcae`` (``MusicDCAE``: a DC-AE latent decoder, the ``ADaMoSHiFiGANV1``
vocoder, then torchaudio resampling to 48 kHz). A run does what ``ACEStepPipeline``
does between loading and writing files: ``get_text_embeddings``, the pipeline's own
``text2music_diffusion_process`` (flow-matching Euler steps with APG guidance), then
``MusicDCAE.decode``.

The weights are seeded random, at reduced sizes (nothing is downloaded): the
transformer has 2 layers of width 64 at ``size="test"`` (4 of width 128 by default)
instead of 24 of 2560; its lyric encoder keeps the released Conformer (6 blocks of
1024, the size ``ACEStepTransformer2DModel`` builds it at); the DC-AE has 4 stages of
16-32 channels; the vocoder 2 ConvNeXt stages of 32 and a 3-stage HiFi-GAN head with
the released hop of 512 samples; UMT5 one layer of width 32.

Install (``ace-step==0.1.0`` on PyPI lacks the model packages; commit a5746ea of the
repository holds the same files plus the models)::

    git clone https://github.com/ace-step/ACE-Step && git -C ACE-Step checkout a5746ea
    pip install --no-deps -e ACE-Step
    pip install loguru pypinyin hangul-romanize num2words spacy py3langid

torchvision must stay uninstalled where its build does not match torch (``MusicDCAE``
imports ``torchvision.transforms`` for one ``Normalize`` on the encode path): this file
then provides that one transform before importing ACE-Step.

    mixprec explain --pipeline examples/acestep_music.py:pipeline --size test --preset fast
    mixprec bench --pipeline examples/acestep_music.py:pipeline --size test --configs fp32,fast,memory
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import types
from dataclasses import dataclass
from typing import Any

import torch

from mixprec.pipelines import AudioOutput, Pipeline

LYRIC_VOCAB = 64
PROMPTS = ("calm piano melody", "soft strings", "piano strings")


def _provide_torchvision_normalize() -> None:
    """``torchvision.transforms.Compose`` / ``Normalize``, where torchvision is not installed."""
    if importlib.util.find_spec("torchvision") is not None or "torchvision" in sys.modules:
        return
    import diffusers  # noqa: F401  (diffusers and transformers probe for torchvision at import)
    import transformers  # noqa: F401

    class Compose:
        def __init__(self, transforms):
            self.transforms = transforms

        def __call__(self, x):
            for t in self.transforms:
                x = t(x)
            return x

    class Normalize:
        def __init__(self, mean, std):
            self.mean, self.std = mean, std

        def __call__(self, x):
            return (x - self.mean) / self.std

    package, transforms = types.ModuleType("torchvision"), types.ModuleType("torchvision.transforms")
    transforms.Compose, transforms.Normalize = Compose, Normalize
    package.transforms = transforms
    sys.modules["torchvision"], sys.modules["torchvision.transforms"] = package, transforms


@dataclass(frozen=True)
class AceStepInputs:
    prompts: tuple[str, ...]
    lyrics: torch.Tensor  # (batch, tokens) lyric token ids
    seed: int


class AceStepMusicPipeline(Pipeline):
    """ACE-Step's own flow over its three components (see the module docstring)."""

    name = "acestep"
    output_kind = "audio"
    sample_rate = 48000
    sensitive = ("type:*Norm*", "ace_step_transformer.final_layer.*", "music_dcae.vocoder.head.conv_post")

    def __init__(self, app: Any, components: dict[str, torch.nn.Module], *, duration: float, steps: int,
                 device: str | torch.device = "cpu") -> None:
        self.app, self.duration, self.steps = app, duration, steps
        super().__init__(components, device=device)

    def _example_inputs(self, batch: int, seed: int) -> AceStepInputs:
        gen = torch.Generator().manual_seed(seed)
        prompts = tuple(PROMPTS[(seed + i) % len(PROMPTS)] for i in range(batch))
        return AceStepInputs(prompts, torch.randint(1, LYRIC_VOCAB, (batch, 12), generator=gen), seed)

    def _run(self, inputs: AceStepInputs) -> AudioOutput:
        app = self.app
        waves = []
        for i, prompt in enumerate(inputs.prompts):
            text, mask = app.get_text_embeddings([prompt], self.device)
            lyrics = inputs.lyrics[i:i + 1].to(self.device)
            latents = app.text2music_diffusion_process(
                duration=self.duration, encoder_text_hidden_states=text, text_attention_mask=mask,
                speaker_embds=torch.zeros(1, app.ace_step_transformer.config.speaker_embedding_dim, device=self.device),
                lyric_token_ids=lyrics, lyric_mask=torch.ones_like(lyrics),
                random_generators=[torch.Generator(device=self.device).manual_seed(inputs.seed + i)],
                infer_steps=self.steps, guidance_scale=15.0, omega_scale=10.0)
            _, wavs = app.music_dcae.decode(latents, sr=self.sample_rate)
            waves.append(wavs[0].float().mean(dim=0))  # stereo -> mono
        return AudioOutput(output=torch.stack(waves), sample_rate=self.sample_rate)


def build(size: str = "default", seed: int = 0) -> tuple[Any, dict[str, torch.nn.Module]]:
    """ACE-Step's app object (an ``ACEStepPipeline``, not loaded from a checkpoint) and its components."""
    _provide_torchvision_normalize()
    from diffusers import AutoencoderDC
    from loguru import logger
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    from acestep.models.ace_step_transformer import ACEStepTransformer2DModel
    from acestep.music_dcae.music_dcae_pipeline import MusicDCAE
    from acestep.music_dcae.music_vocoder import ADaMoSHiFiGANV1
    from acestep.pipeline_ace_step import ACEStepPipeline

    logger.disable("acestep")  # its per-call info lines
    test = size == "test"
    torch.manual_seed(seed)
    checkpoints = tempfile.mkdtemp(prefix="mixprec-acestep-")
    # MusicDCAE loads its two parts with from_pretrained: save seeded random ones first.
    stages = (16, 32, 32, 32)
    AutoencoderDC(in_channels=2, latent_channels=8, attention_head_dim=8, encoder_block_types="ResBlock",
                  decoder_block_types="ResBlock", encoder_block_out_channels=stages, decoder_block_out_channels=stages,
                  encoder_layers_per_block=(1,) * 4, decoder_layers_per_block=(1,) * 4,
                  encoder_qkv_multiscales=((),) * 4, decoder_qkv_multiscales=((),) * 4).save_pretrained(f"{checkpoints}/dcae")
    ADaMoSHiFiGANV1(input_channels=128, depths=[1, 1], dims=[32, 32], upsample_rates=(8, 8, 8),
                    upsample_kernel_sizes=(16, 16, 16), resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 3, 5),),
                    num_mels=32, upsample_initial_channel=32, pre_conv_kernel_size=7,
                    post_conv_kernel_size=7).save_pretrained(f"{checkpoints}/vocoder")
    music_dcae = MusicDCAE(dcae_checkpoint_path=f"{checkpoints}/dcae", vocoder_checkpoint_path=f"{checkpoints}/vocoder")
    width = 64 if test else 128
    transformer = ACEStepTransformer2DModel(
        in_channels=8, num_layers=2 if test else 4, inner_dim=width, attention_head_dim=16, num_attention_heads=width // 16,
        mlp_ratio=2.5, out_channels=8, max_position=4096, speaker_embedding_dim=16, text_embedding_dim=32,
        ssl_encoder_depths=[1, 1], ssl_latent_dims=[16, 16], lyric_encoder_vocab_size=LYRIC_VOCAB,
        lyric_hidden_size=1024, patch_size=[16, 1], max_height=16, max_width=4096)
    words = sorted({w for p in PROMPTS for w in p.split()})
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tokenizer_model = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer_model.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer_model, pad_token="<pad>", eos_token="</s>",
                                        unk_token="<unk>")
    text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(vocab), d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                               num_heads=4))

    app = ACEStepPipeline.__new__(ACEStepPipeline)  # its __init__ only records where checkpoints are
    app.dtype, app.device, app.loaded, app.torch_compile = torch.float32, torch.device("cpu"), True, False
    app.music_dcae, app.ace_step_transformer = music_dcae, transformer
    app.text_encoder_model, app.text_tokenizer = text_encoder, tokenizer
    return app, {"text_encoder_model": text_encoder, "ace_step_transformer": transformer, "music_dcae": music_dcae}


def pipeline(size: str = "default", seed: int = 0, device: str = "cpu") -> AceStepMusicPipeline:
    """The mixprec factory: ``--pipeline examples/acestep_music.py:pipeline``."""
    app, components = build(size, seed)
    pipe = AceStepMusicPipeline(app, components, duration=1.5 if size == "test" else 3.0, steps=3 if size == "test" else 6,
                                device=device)
    app.device = pipe.device
    return pipe
