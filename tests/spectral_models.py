"""A vocoder head that ends in an inverse STFT, as HiFT-style vocoders do.

``torch.complex`` and ``torch.istft`` have no bf16 kernel on CPU; the magnitude and
phase come from a 16-bit convolution under a bf16 policy.
"""

from __future__ import annotations

import torch
from torch import nn


class ISTFTHead(nn.Module):
    def __init__(self, channels: int = 16, n_fft: int = 16):
        super().__init__()
        self.n_fft = n_fft
        self.conv_post = nn.Conv1d(channels, n_fft + 2, 3, padding=1)
        self.register_buffer("window", torch.hann_window(n_fft), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv_post(x)
        bins = self.n_fft // 2 + 1
        magnitude = torch.exp(out[:, :bins].clamp(max=3))
        phase = torch.sin(out[:, bins:])
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        return torch.istft(spec, self.n_fft, hop_length=self.n_fft // 4, window=self.window)


class SpectralVocoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Conv1d(8, 16, 3, padding=1)
        self.head = ISTFTHead()

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.pre(mel)))

    def inference(self, mel: torch.Tensor) -> torch.Tensor:
        return self.head.forward(torch.relu(self.pre(mel)))


def spectral_vocoder(seed: int = 0) -> SpectralVocoder:
    torch.manual_seed(seed)
    return SpectralVocoder().eval()
