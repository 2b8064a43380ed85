"""``diffusion``: a Stable-Diffusion-shaped text-to-image pipeline with random, seeded weights.

Components: ``text_encoder`` (``transformers.CLIPTextModel``), ``unet``
(``diffusers.UNet2DConditionModel``) and ``vae`` (``diffusers.AutoencoderKL``;
only its decoder runs).  A ``diffusers.DDIMScheduler`` drives a fixed number
of denoising steps with optional classifier-free guidance.  Prompts are turned
into token ids by a small hashing tokenizer, so nothing is downloaded.

Teacher forcing: every run records the latents each denoising step started from
and the (guided) noise prediction of every step (:class:`DiffusionOutput`).  A run
given a reference run's latents (:meth:`DiffusionPipeline.teacher_forced`, or
``run(inputs, latents=...)``) evaluates the UNet at every step on those latents
instead of its own, and takes its last step from the reference's last latents.
With random weights a free-running trajectory amplifies each step's rounding
into a different image; the teacher-forced noise predictions show each step's
own error, which orders configurations as their arithmetic does.
"""

from __future__ import annotations

import dataclasses
import random
import re
import zlib
from dataclasses import dataclass

import torch

from mixprec.pipelines._base import ImageOutput, Pipeline, make_generator, module_dtype, seeded, sized_config

__all__ = [
    "PROMPTS", "SIZES", "SIZE_NOTES", "DiffusionConfig", "DiffusionInputs", "DiffusionOutput",
    "DiffusionPipeline", "build",
]

PROMPTS: tuple[str, ...] = (
    "a watercolor painting of a lighthouse at dawn",
    "a red bicycle leaning against a brick wall",
    "a bowl of ramen with a soft boiled egg, studio lighting",
    "a snowy mountain village at night, oil painting",
    "a golden retriever puppy playing in autumn leaves",
    "an astronaut riding a horse on the moon",
    "a futuristic city skyline reflected in a river",
    "a cup of coffee on a wooden table, morning light",
)

_WORD = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")


@dataclass(frozen=True)
class DiffusionConfig:
    """Sizes of the diffusion pipeline (see :data:`SIZES`)."""

    vocab_size: int = 8192
    max_length: int = 77
    text_hidden: int = 512
    text_layers: int = 6
    text_heads: int = 8
    text_intermediate: int = 2048
    unet_channels: tuple[int, ...] = (128, 256, 512)
    unet_layers_per_block: int = 2
    unet_head_dim: int = 8
    norm_groups: int = 32
    latent_size: int = 32
    vae_channels: tuple[int, ...] = (32, 64, 128, 128)
    vae_layers_per_block: int = 2
    steps: int = 10
    guidance_scale: float = 7.5


#: Named sizes: ``"default"`` for benchmarks on a CPU, ``"test"`` for the test suite,
#: ``"large"`` (Stable Diffusion 1.5's shapes) for benchmarks on a GPU.
SIZES: dict[str, DiffusionConfig] = {
    "default": DiffusionConfig(),
    "test": DiffusionConfig(
        vocab_size=512, max_length=16, text_hidden=32, text_layers=2, text_heads=2,
        text_intermediate=64, unet_channels=(32, 64), unet_layers_per_block=1, unet_head_dim=8,
        norm_groups=8, latent_size=8, vae_channels=(8, 8, 16, 16), vae_layers_per_block=1,
        steps=2,
    ),
    # SD-1.5: CLIP ViT-L/14's text encoder (its vocabulary too), the 860M-parameter UNet
    # (8 attention heads), the 512 px VAE, 20 DDIM steps.
    "large": DiffusionConfig(
        vocab_size=49408, text_hidden=768, text_layers=12, text_heads=12, text_intermediate=3072,
        unet_channels=(320, 640, 1280, 1280), unet_layers_per_block=2, unet_head_dim=8,
        latent_size=64, vae_channels=(128, 256, 512, 512), vae_layers_per_block=2, steps=20,
    ),
}

#: What each size is for (``mixprec pipelines`` prints it).
SIZE_NOTES: dict[str, str] = {
    "default": "benchmarks on a 2-core CPU: 256 px, 10 steps",
    "test": "the test suite: tiny, 64 px, 2 steps",
    "large": "benchmarks on a GPU: Stable Diffusion 1.5 shapes (CLIP-L text encoder, 860M UNet), "
    "512 px, 20 steps",
}


@dataclass(frozen=True)
class DiffusionInputs:
    """Inputs of :class:`DiffusionPipeline`.

    Attributes:
        prompt_ids: ``(batch, max_length)`` token ids of the prompts.
        negative_ids: ``(batch, max_length)`` token ids of the empty prompt (guidance).
        seed: Seed of the initial latent noise.
        prompts: The prompts behind ``prompt_ids``.
        latents: Optional ``(steps, batch, 4, h, w)`` latents of a reference run
            (its :attr:`DiffusionOutput.latents`); when set, the run is teacher-forced
            with them.
    """

    prompt_ids: torch.Tensor
    negative_ids: torch.Tensor
    seed: int
    prompts: tuple[str, ...] = ()
    latents: torch.Tensor | None = None


@dataclass
class DiffusionOutput(ImageOutput):
    """Images, plus what teacher forcing needs and compares.

    Attributes:
        latents: ``(steps, batch, 4, h, w)``: the latents every denoising step
            started from (under teacher forcing, the forced ones), in float32.
        noise_predictions: ``(steps, batch, 4, h, w)``: every step's noise
            prediction (after classifier-free guidance), in float32.
    """

    latents: torch.Tensor | None = None
    noise_predictions: torch.Tensor | None = None


def tokenize(text: str, *, vocab_size: int, max_length: int) -> list[int]:
    """Hash words and punctuation of ``text`` to ids: ``[bos, words..., eos, pad...]``.

    Ids ``vocab_size - 2`` and ``vocab_size - 1`` are the start and end
    markers; the end marker also pads.  The hash (CRC-32) is stable across runs.
    """
    bos, eos = vocab_size - 2, vocab_size - 1
    words = [zlib.crc32(w.encode()) % (vocab_size - 2) for w in _WORD.findall(text.lower())]
    ids = [bos, *words[: max_length - 2], eos]
    return ids + [eos] * (max_length - len(ids))


class DiffusionPipeline(Pipeline):
    """Latent text-to-image diffusion (see the module docstring)."""

    name = "diffusion"
    output_kind = "image"
    work_option = ("steps", 2)
    sensitive = (
        "type:GroupNorm",
        "type:LayerNorm",
        "text_encoder*.final_layer_norm",
        "unet.time_embedding.*",
        "unet.conv_out",
        "vae.post_quant_conv",
        "vae.decoder.conv_out",
    )

    def __init__(
        self, config: DiffusionConfig, *, seed: int = 0, device: str | torch.device = "cpu"
    ) -> None:
        from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
        from transformers import CLIPTextConfig, CLIPTextModel

        self.config = config
        self.seed = seed
        n_unet = len(config.unet_channels)
        n_vae = len(config.vae_channels)
        text_config = CLIPTextConfig(
            vocab_size=config.vocab_size,
            hidden_size=config.text_hidden,
            intermediate_size=config.text_intermediate,
            num_hidden_layers=config.text_layers,
            num_attention_heads=config.text_heads,
            max_position_embeddings=config.max_length,
            projection_dim=config.text_hidden,
            bos_token_id=config.vocab_size - 2,
            eos_token_id=config.vocab_size - 1,
            pad_token_id=config.vocab_size - 1,
        )
        with seeded(seed):
            components = {
                "text_encoder": CLIPTextModel(text_config),
                "unet": UNet2DConditionModel(
                    sample_size=config.latent_size,
                    in_channels=4,
                    out_channels=4,
                    block_out_channels=config.unet_channels,
                    layers_per_block=config.unet_layers_per_block,
                    down_block_types=("CrossAttnDownBlock2D",) * (n_unet - 1) + ("DownBlock2D",),
                    up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * (n_unet - 1),
                    cross_attention_dim=config.text_hidden,
                    attention_head_dim=config.unet_head_dim,
                    norm_num_groups=config.norm_groups,
                ),
                "vae": AutoencoderKL(
                    in_channels=3,
                    out_channels=3,
                    latent_channels=4,
                    block_out_channels=config.vae_channels,
                    down_block_types=("DownEncoderBlock2D",) * n_vae,
                    up_block_types=("UpDecoderBlock2D",) * n_vae,
                    layers_per_block=config.vae_layers_per_block,
                    norm_num_groups=min(config.norm_groups, min(config.vae_channels)),
                    sample_size=config.latent_size * 2 ** (n_vae - 1),
                ),
            }
        # clip_sample bounds the predicted clean latents, which keeps random
        # weights from driving the latents (and the decoded image) to extremes.
        self.scheduler = DDIMScheduler(
            beta_start=0.00085,
            beta_end=0.012,
            beta_schedule="scaled_linear",
            clip_sample=True,
            set_alpha_to_one=False,
            steps_offset=1,
        )
        super().__init__(components, device=device)

    @property
    def image_size(self) -> int:
        """Height and width of the generated images, in pixels."""
        return self.config.latent_size * 2 ** (len(self.config.vae_channels) - 1)

    def _example_inputs(self, batch: int, seed: int) -> DiffusionInputs:
        cfg = self.config
        chooser = random.Random(seed)
        prompts = tuple(chooser.choice(PROMPTS) for _ in range(batch))
        ids = [tokenize(p, vocab_size=cfg.vocab_size, max_length=cfg.max_length) for p in prompts]
        empty = tokenize("", vocab_size=cfg.vocab_size, max_length=cfg.max_length)
        return DiffusionInputs(
            prompt_ids=torch.tensor(ids, dtype=torch.long),
            negative_ids=torch.tensor([empty] * batch, dtype=torch.long),
            seed=seed,
            prompts=prompts,
        )

    def teacher_forced(self, inputs: DiffusionInputs, reference: DiffusionOutput) -> DiffusionInputs:
        """Return ``inputs`` with the latents of ``reference`` to force every step with."""
        if getattr(reference, "latents", None) is None:
            raise ValueError("reference output has no latents to teacher-force with")
        return dataclasses.replace(inputs, latents=reference.latents)

    def _run(self, inputs: DiffusionInputs, *, latents: torch.Tensor | None = None) -> DiffusionOutput:
        if not isinstance(inputs, DiffusionInputs):
            raise ValueError(
                f"diffusion inputs must be DiffusionInputs, got {type(inputs).__name__}"
            )
        cfg = self.config
        batch = inputs.prompt_ids.shape[0]
        shape = (batch, 4, cfg.latent_size, cfg.latent_size)
        forced = inputs.latents if latents is None else latents.to(self.device)
        if forced is not None:
            self._check_forced(forced, shape)
        text_encoder, unet, vae = (self.components[k] for k in ("text_encoder", "unet", "vae"))
        guided = cfg.guidance_scale > 1.0
        ids = torch.cat([inputs.negative_ids, inputs.prompt_ids]) if guided else inputs.prompt_ids
        context = text_encoder(input_ids=ids).last_hidden_state.to(module_dtype(unet))

        latents = torch.randn(shape, generator=make_generator(inputs.seed)).to(self.device)
        self.scheduler.set_timesteps(cfg.steps, device=self.device)
        latents = latents * self.scheduler.init_noise_sigma
        seen, predictions = [], []
        for step, t in enumerate(self.scheduler.timesteps):
            if forced is not None:
                latents = forced[step].float()
            seen.append(latents)
            model_in = torch.cat([latents, latents]) if guided else latents
            model_in = self.scheduler.scale_model_input(model_in, t).to(module_dtype(unet))
            noise_pred = unet(model_in, t, encoder_hidden_states=context).sample.float()
            if guided:
                uncond, cond = noise_pred.chunk(2)
                noise_pred = uncond + cfg.guidance_scale * (cond - uncond)
            predictions.append(noise_pred)
            latents = self.scheduler.step(noise_pred, t, latents).prev_sample

        scaled = (latents / vae.config.scaling_factor).to(module_dtype(vae))
        decoded = vae.decode(scaled).sample.float()
        return DiffusionOutput(
            output=(decoded / 2 + 0.5).clamp(0.0, 1.0),
            latents=torch.stack(seen),
            noise_predictions=torch.stack(predictions),
        )

    def _check_forced(self, forced: torch.Tensor, shape: tuple[int, ...]) -> None:
        expected = (self.config.steps, *shape)
        if tuple(forced.shape) != expected or not forced.is_floating_point():
            raise ValueError(
                f"latents must be a floating-point tensor of shape (steps, batch, 4, h, w) = "
                f"{expected}, got {tuple(forced.shape)} {forced.dtype}"
            )


def build(
    *, size: str = "default", seed: int = 0, device: str | torch.device = "cpu", **overrides: object
) -> DiffusionPipeline:
    """Build the ``diffusion`` pipeline.

    Args:
        size: A key of :data:`SIZES`.
        seed: Seed of the weight initialisation.
        device: Device of the components.
        **overrides: Fields of :class:`DiffusionConfig` to change, e.g. ``steps=20``.

    Raises:
        ValueError: For an unknown size or override name.
    """
    config = sized_config("diffusion", SIZES, size, overrides)
    return DiffusionPipeline(config, seed=seed, device=device)
