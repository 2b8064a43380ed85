"""Small models written the way real app code is written (in the style of Chatterbox).

Tensors are created inside forwards, carried in dataclasses, passed by keyword, held in
ModuleLists that are never called, and app methods other than ``forward`` call children
directly or cast to ``self.dtype`` before ops that have no 16-bit kernel. This file must
not use spectral ops (a file that does gets fp32 spectral scopes on its classes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Cond:
    """Conditioning carried in a dataclass, as Chatterbox's ``T3Cond``."""

    speaker_emb: torch.Tensor
    strength: float = 1.0


class CondEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.spkr_enc = nn.Linear(8, 16)

    def forward(self, cond: Cond) -> torch.Tensor:
        return self.spkr_enc(cond.speaker_emb) * cond.strength


class SineSource(nn.Module):
    """Creates its harmonics in fp32 inside forward, as HiFi-GAN's source module does."""

    def __init__(self):
        super().__init__()
        self.l_linear = nn.Linear(4, 16)

    def forward(self, f0: torch.Tensor) -> torch.Tensor:
        phase = torch.cumsum(f0.float(), dim=1) * 0.01
        harmonics = torch.arange(1, 5, dtype=torch.float32)
        sines = torch.sin(phase * harmonics)  # fp32, whatever the module stores
        return torch.tanh(self.l_linear(sines))


class Vocoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.source = SineSource()
        self.pre = nn.Conv1d(16, 16, 3, padding=1)
        self.downs = nn.ModuleList([nn.Conv1d(16, 16, 1), nn.Conv1d(16, 16, 1)])
        self.post = nn.Conv1d(16, 1, 1)

    def forward(self, h: torch.Tensor, f0: torch.Tensor) -> torch.Tensor:
        x = self.pre(h.transpose(1, 2)) + self.source(f0).transpose(1, 2)
        for down in self.downs:
            x = torch.relu(down(x))
        return self.post(x).squeeze(1)

    def inference(self, h: torch.Tensor, f0: torch.Tensor) -> torch.Tensor:
        return self.forward(h, f0)


class TinyTTS(nn.Module):
    """A component used through its methods, as S3Gen is (``inference``, ``embed_ref``)."""

    def __init__(self):
        super().__init__()
        self.cond_enc = CondEncoder()
        self.vocoder = Vocoder()
        self.proj = nn.Linear(16, 16)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.vocoder.parameters()).dtype

    def forward(self, tokens_emb: torch.Tensor, cond: Cond, *, f0: torch.Tensor) -> torch.Tensor:
        h = self.proj(tokens_emb) + self.cond_enc(cond).unsqueeze(1)
        return self.vocoder(h, f0)

    def inference(self, tokens_emb: torch.Tensor, cond: Cond, f0: torch.Tensor) -> torch.Tensor:
        # Children reached through methods and a direct .forward call: no hook of the
        # component or of the vocoder itself fires.
        h = self.proj(tokens_emb) + self.cond_enc.forward(cond).unsqueeze(1)
        return self.vocoder.inference(h, f0)

    def embed_ref(self, ref: torch.Tensor) -> torch.Tensor:
        """App code: casts to ``self.dtype``, then an op without a 16-bit CPU kernel."""
        x = ref.to(self.dtype)
        distances = torch.cdist(x, x)  # "cdist" not implemented for 'BFloat16' / 'Half'
        return distances.float().mean(dim=-1)


def tts_inputs(seed: int = 0, batch: int = 2, steps: int = 12):
    gen = torch.Generator().manual_seed(seed)
    tokens_emb = torch.randn(batch, steps, 16, generator=gen)
    cond = Cond(speaker_emb=torch.randn(batch, 8, generator=gen))
    f0 = 100 + 50 * torch.rand(batch, steps, 1, generator=gen)
    return tokens_emb, cond, f0


def tiny_tts(seed: int = 0) -> TinyTTS:
    torch.manual_seed(seed)
    return TinyTTS().eval()


class MelVocoder(nn.Module):
    """A vocoder used through its own method, as ACE-Step's vocoder is (``decode``)."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose1d(8, 8, 4, stride=2, padding=1)
        self.out = nn.Conv1d(8, 1, 3, padding=1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.out(torch.relu(self.up(mel))))

    def decode(self, mel: torch.Tensor) -> torch.Tensor:
        return self.forward(mel).squeeze(1)


class Backbone(nn.Module):
    """A holder without methods of its own: the app reaches through it (``self.backbone.vocoder``)."""

    def __init__(self):
        super().__init__()
        self.decoder = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.SiLU(), nn.Conv1d(8, 8, 3, padding=1))
        self.vocoder = MelVocoder()


class TinyCodec(nn.Module):
    """Latents to a resampled waveform in the component's own methods, as ``MusicDCAE.decode``.

    The method bodies are app code: they call modules at any depth and hand what comes
    back to library code with tensors of their own, in fp32 as the app wrote them.
    """

    def __init__(self):
        super().__init__()
        self.backbone = Backbone()
        self.scale = 0.5

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return self.backbone.vocoder(self.backbone.decoder(latents))

    def decode(self, latents: torch.Tensor, sr: int = 16000) -> torch.Tensor:
        """Through a grandchild's own method, then torchaudio's resampling."""
        import torchaudio

        mel = self.backbone.decoder(latents / self.scale)
        wav = self.backbone.vocoder.decode(mel)
        return torchaudio.functional.resample(wav, sr, 24000)

    def decode_smoothed(self, latents: torch.Tensor) -> torch.Tensor:
        """Through a grandchild's forward, then a convolution with a kernel made here in fp32."""
        wav = self.backbone.vocoder(self.backbone.decoder(latents)).squeeze(1)
        kernel = torch.hann_window(5, periodic=False).view(1, 1, 5)
        kernel = kernel / kernel.sum()
        return torch.nn.functional.conv1d(wav.unsqueeze(1), kernel, padding=2).squeeze(1)


def tiny_codec(seed: int = 0) -> TinyCodec:
    torch.manual_seed(seed)
    return TinyCodec().eval()


def codec_latents(seed: int = 0, batch: int = 2, frames: int = 16) -> torch.Tensor:
    return torch.randn(batch, 4, frames, generator=torch.Generator().manual_seed(seed))


class LazyPositionalEncoding(nn.Module):
    """A table kept as a plain attribute and re-made in the dtype of what it meets, as
    ESPnet's ``RelPositionalEncoding.extend_pe`` (ACE-Step's lyric encoder) does; plus a
    mask cached on first use in an attribute that starts as ``None``."""

    def __init__(self, d: int = 8, max_len: int = 16):
        super().__init__()
        position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
        self.pe = torch.sin(position / (1 + torch.arange(d, dtype=torch.float32)) * 3.7)
        self.mask = None

    def extend_pe(self, x: torch.Tensor) -> None:
        if self.pe.dtype != x.dtype:
            self.pe = self.pe.to(dtype=x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.extend_pe(x)
        if self.mask is None:
            self.mask = torch.ones(x.shape[-2], 1, dtype=x.dtype)
        return x + self.pe[: x.shape[-2]] * self.mask


class EncoderWithCache(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.pos = LazyPositionalEncoding()
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.pos(self.proj(x)))


class SmoothingCodec(TinyCodec):
    """The same decoder, with the smoothing in ``forward``: module code, not a method's app code."""

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        wav = self.backbone.vocoder(self.backbone.decoder(latents)).squeeze(1)
        kernel = torch.hann_window(5, periodic=False).view(1, 1, 5)
        return torch.nn.functional.conv1d(wav.unsqueeze(1), kernel / kernel.sum(), padding=2).squeeze(1)
