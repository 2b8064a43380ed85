"""Neural parts of the Chatterbox-shaped text-to-speech pipeline (except the Llama).

* :class:`VoiceEncoder` - LSTM speaker encoder over a reference mel.
* :class:`T3Conditioner` - turns text ids and a speaker embedding into the
  prefix embeddings the Llama backbone is conditioned on.
* :class:`FlowDecoder` - conditional flow matching from speech tokens to mel
  frames, integrated with a fixed number of Euler steps.
* :class:`HiFiGANVocoder` - mel to waveform generator.

Every module casts its inputs to its own parameter dtype and returns float32,
so components can be given different precisions independently.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from mixprec.pipelines._base import module_dtype

__all__ = ["FlowDecoder", "HiFiGANVocoder", "T3Conditioner", "VoiceEncoder"]


class VoiceEncoder(nn.Module):
    """Speaker encoder: stacked LSTM over mel frames, projection, L2 normalisation.

    Args:
        n_mels: Mel bins of the reference mel.
        hidden: LSTM width.
        layers: Number of LSTM layers.
        embed_dim: Size of the speaker embedding.
    """

    def __init__(self, *, n_mels: int, hidden: int, layers: int, embed_dim: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(n_mels, hidden, num_layers=layers, batch_first=True)
        self.proj = nn.Linear(hidden, embed_dim)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """Map ``(batch, frames, n_mels)`` to unit-norm ``(batch, embed_dim)`` (float32)."""
        _, (hidden, _) = self.lstm(mel.to(module_dtype(self)))
        embedding = self.proj(hidden[-1]).float()
        return F.normalize(embedding, dim=-1)


class T3Conditioner(nn.Module):
    """Prefix embeddings for the T3 backbone: ``[speaker, text...]``.

    Args:
        text_vocab: Number of text token ids.
        max_text_len: Longest text prompt (learned positions).
        spk_dim: Size of the speaker embedding.
        hidden: Width of the backbone.
    """

    def __init__(self, *, text_vocab: int, max_text_len: int, spk_dim: int, hidden: int) -> None:
        super().__init__()
        self.text_embedding = nn.Embedding(text_vocab, hidden)
        self.text_position = nn.Embedding(max_text_len, hidden)
        self.speaker_proj = nn.Linear(spk_dim, hidden)
        for table in (self.text_embedding, self.text_position):
            nn.init.normal_(table.weight, std=0.02)

    def forward(self, text_ids: torch.Tensor, speaker: torch.Tensor) -> torch.Tensor:
        """Return ``(batch, 1 + text_len, hidden)`` in this module's dtype."""
        positions = torch.arange(text_ids.shape[1], device=text_ids.device)
        text = self.text_embedding(text_ids) + self.text_position(positions)[None]
        spk = self.speaker_proj(speaker.to(module_dtype(self)))[:, None]
        return torch.cat([spk, text], dim=1)


class _Attention(nn.Module):
    """Pre-norm multi-head self-attention with a fused QKV projection."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, steps, dim = x.shape
        qkv = self.qkv(self.norm(x)).view(batch, steps, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attended = F.scaled_dot_product_attention(q, k, v)
        return x + self.out(attended.transpose(1, 2).reshape(batch, steps, dim))


class _FeedForward(nn.Module):
    """Pre-norm GELU MLP with a residual connection."""

    def __init__(self, dim: int, mult: int = 4) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, mult * dim)
        self.down = nn.Linear(mult * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class _ConvModule(nn.Module):
    """Pre-norm temporal convolution (kernel 3) with Mish and a residual connection."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.conv = nn.Conv1d(dim, dim, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(self.norm(x).transpose(1, 2)).transpose(1, 2)
        return x + F.mish(y)


class _EstimatorBlock(nn.Module):
    """Time-conditioned block: add time projection, convolution, attention, MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.time_proj = nn.Linear(dim, dim)
        self.conv = _ConvModule(dim)
        self.attn = _Attention(dim, heads)
        self.ff = _FeedForward(dim)

    def forward(self, x: torch.Tensor, time_emb: torch.Tensor) -> torch.Tensor:
        x = x + self.time_proj(time_emb)[:, None]
        return self.ff(self.attn(self.conv(x)))


class _Estimator(nn.Module):
    """Velocity field ``v(x_t, t | mu, speaker)`` over mel frames."""

    def __init__(self, *, n_mels: int, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.time_dim = 256
        self.in_proj = nn.Linear(3 * n_mels, dim)
        self.time_mlp = nn.Sequential(nn.Linear(self.time_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.blocks = nn.ModuleList(_EstimatorBlock(dim, heads) for _ in range(layers))
        self.norm_out = nn.LayerNorm(dim)
        self.out_proj = nn.Linear(dim, n_mels)

    def _time_features(self, t: torch.Tensor) -> torch.Tensor:
        half = self.time_dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device) / half)
        angles = 1000.0 * t.float()[:, None] * freqs[None]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)

    def forward(
        self, x: torch.Tensor, t: torch.Tensor, mu: torch.Tensor, speaker: torch.Tensor
    ) -> torch.Tensor:
        """All of ``x``, ``mu``: ``(batch, frames, n_mels)``; ``speaker``: ``(batch, n_mels)``."""
        dtype = module_dtype(self)
        spk = speaker[:, None].expand_as(x)
        h = self.in_proj(torch.cat([x, mu, spk], dim=-1).to(dtype))
        time_emb = self.time_mlp(self._time_features(t).to(dtype))
        for block in self.blocks:
            h = block(h, time_emb)
        return self.out_proj(self.norm_out(h)).float()


class FlowDecoder(nn.Module):
    """Speech tokens + speaker embedding -> mel, by conditional flow matching.

    The token sequence is embedded, contextualised by a transformer encoder,
    upsampled to mel frame rate and projected to ``mu``.  Starting from noise,
    ``steps`` Euler steps along a cosine time schedule integrate the estimated
    velocity, with classifier-free guidance when ``cfg_rate > 0``.

    Args:
        vocab: Number of speech token ids.
        n_mels: Mel bins produced.
        spk_dim: Size of the speaker embedding.
        dim: Transformer width of encoder and estimator.
        heads: Attention heads.
        encoder_layers: Encoder depth.
        estimator_layers: Estimator depth.
        frames_per_token: Mel frames per speech token.
    """

    def __init__(
        self,
        *,
        vocab: int,
        n_mels: int,
        spk_dim: int,
        dim: int,
        heads: int,
        encoder_layers: int,
        estimator_layers: int,
        frames_per_token: int,
    ) -> None:
        super().__init__()
        self.frames_per_token = frames_per_token
        self.token_embedding = nn.Embedding(vocab, dim)
        self.encoder = nn.ModuleList(
            nn.Sequential(_Attention(dim, heads), _FeedForward(dim)) for _ in range(encoder_layers)
        )
        self.encoder_norm = nn.LayerNorm(dim)
        self.encoder_proj = nn.Linear(dim, n_mels)
        self.speaker_proj = nn.Linear(spk_dim, n_mels)
        self.estimator = _Estimator(n_mels=n_mels, dim=dim, heads=heads, layers=estimator_layers)

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Return ``mu`` of shape ``(batch, tokens * frames_per_token, n_mels)`` in float32."""
        h = self.token_embedding(tokens)
        for layer in self.encoder:
            h = layer(h)
        h = h.repeat_interleave(self.frames_per_token, dim=1)
        return self.encoder_proj(self.encoder_norm(h)).float()

    def forward(
        self,
        tokens: torch.Tensor,
        speaker: torch.Tensor,
        noise: torch.Tensor,
        *,
        steps: int,
        cfg_rate: float,
    ) -> torch.Tensor:
        """Integrate from ``noise`` ``(batch, frames, n_mels)``.

        Returns:
            Mel ``(batch, n_mels, frames)`` in float32.
        """
        mu = self.encode(tokens)
        spk = self.speaker_proj(speaker.to(module_dtype(self))).float()
        if cfg_rate > 0:
            mu_in = torch.cat([mu, torch.zeros_like(mu)])
            spk_in = torch.cat([spk, torch.zeros_like(spk)])
        else:
            mu_in, spk_in = mu, spk
        x = noise.float()
        grid = 1.0 - torch.cos(torch.linspace(0.0, 1.0, steps + 1, device=x.device) * math.pi / 2)
        for i in range(steps):
            t, dt = grid[i], grid[i + 1] - grid[i]
            x_in = torch.cat([x, x]) if cfg_rate > 0 else x
            velocity = self.estimator(x_in, t.expand(x_in.shape[0]), mu_in, spk_in)
            if cfg_rate > 0:
                cond, uncond = velocity.chunk(2)
                velocity = (1.0 + cfg_rate) * cond - cfg_rate * uncond
            x = x + dt * velocity
        return x.transpose(1, 2)


class _ResBlock(nn.Module):
    """HiFi-GAN residual block: pairs of (dilated conv, conv) with leaky ReLU."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel, dilation=d, padding=d * (kernel - 1) // 2)
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel, padding=(kernel - 1) // 2) for _ in dilations
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for dilated, plain in zip(self.convs1, self.convs2):
            x = x + plain(F.leaky_relu(dilated(F.leaky_relu(x, 0.1)), 0.1))
        return x


class HiFiGANVocoder(nn.Module):
    """HiFi-GAN generator: ``conv_pre``, upsampling stages with multi-receptive-field
    residual blocks, ``conv_post`` and ``tanh``.

    Args:
        n_mels: Mel bins consumed.
        channels: Channels after ``conv_pre``; halved by every upsampling stage.
        upsample_rates: Stride of every transposed convolution; their product is
            the hop length (samples per mel frame).
        kernels: Kernel sizes of the parallel residual blocks.
        dilations: Dilations inside every residual block.
    """

    def __init__(
        self,
        *,
        n_mels: int,
        channels: int,
        upsample_rates: tuple[int, ...],
        kernels: tuple[int, ...],
        dilations: tuple[int, ...],
    ) -> None:
        super().__init__()
        self.hop_length = math.prod(upsample_rates)
        self.conv_pre = nn.Conv1d(n_mels, channels, 7, padding=3)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        width = channels
        for rate in upsample_rates:
            # Output length is exactly input * rate: 2*padding - output_padding == rate.
            self.ups.append(
                nn.ConvTranspose1d(
                    width, width // 2, 2 * rate, stride=rate,
                    padding=(rate + 1) // 2, output_padding=rate % 2,
                )
            )
            width //= 2
            self.resblocks.append(nn.ModuleList(_ResBlock(width, k, dilations) for k in kernels))
        self.conv_post = nn.Conv1d(width, 1, 7, padding=3)
        self._init_trunk()

    def _init_trunk(self) -> None:
        """Variance-preserving init of the trunk (pre, upsampling, post convolutions).

        PyTorch's default init shrinks the signal at every transposed
        convolution, which leaves a randomly initialised vocoder nearly silent.
        """
        gain = nn.init.calculate_gain("leaky_relu", 0.1)
        for conv in (self.conv_pre, *self.ups, self.conv_post):
            if isinstance(conv, nn.ConvTranspose1d):
                fan_in = conv.in_channels * conv.kernel_size[0] // conv.stride[0]
            else:
                fan_in = conv.in_channels * conv.kernel_size[0]
            nn.init.normal_(conv.weight, std=gain / math.sqrt(fan_in))
            nn.init.zeros_(conv.bias)
        # Aim for speech-like loudness rather than a saturated tanh.
        with torch.no_grad():
            self.conv_post.weight.mul_(0.25)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """Map mel ``(batch, n_mels, frames)`` to waveform ``(batch, frames * hop_length)``."""
        x = self.conv_pre(mel.to(module_dtype(self)))
        for up, blocks in zip(self.ups, self.resblocks):
            x = up(F.leaky_relu(x, 0.1))
            x = sum(block(x) for block in blocks) / len(blocks)
        x = self.conv_post(F.leaky_relu(x))
        return torch.tanh(x.float()).squeeze(1)
