"""fp8 weights on diffusers' DiT-style transformers (SD3, Flux, PixArt): tiny seeded models,
applied alone and under the guard, bit-exact revert, most layer weights in 8 bits.

These models own the layers skip lists by name get wrong (adaptive-norm modulation
``Linear``s, time embedders, ``pos_embed``): which of them stay 16-bit is for measurement
(``mixprec tune --objective memory``); a plain fp8 policy stores them all in fp8.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import mixprec
from mixprec import Policy, Rule

pytest.importorskip("diffusers")

FP8 = Policy(rules=(Rule("*", storage="fp8"),))


def _sd3():
    from diffusers import SD3Transformer2DModel

    model = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
                                  num_attention_heads=4, joint_attention_dim=32, caption_projection_dim=32,
                                  pooled_projection_dim=16, out_channels=4, pos_embed_max_size=16)
    return model, dict(hidden_states=torch.randn(1, 4, 8, 8), encoder_hidden_states=torch.randn(1, 5, 32),
                       pooled_projections=torch.randn(1, 16), timestep=torch.tensor([500.0]))


def _flux():
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=1, num_single_layers=1, attention_head_dim=16,
                                   num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, axes_dims_rope=(4, 6, 6))
    return model, dict(hidden_states=torch.randn(1, 16, 8), encoder_hidden_states=torch.randn(1, 5, 32),
                       pooled_projections=torch.randn(1, 16), timestep=torch.tensor([0.5]), img_ids=torch.zeros(16, 3),
                       txt_ids=torch.zeros(5, 3))


def _pixart():
    from diffusers import PixArtTransformer2DModel

    model = PixArtTransformer2DModel(sample_size=8, num_layers=2, attention_head_dim=8, num_attention_heads=2, in_channels=4,
                                     out_channels=8, cross_attention_dim=16, caption_channels=32)
    return model, dict(hidden_states=torch.randn(1, 4, 8, 8), encoder_hidden_states=torch.randn(1, 5, 32),
                       timestep=torch.tensor([500]), added_cond_kwargs={"resolution": None, "aspect_ratio": None})


@pytest.mark.parametrize("guarded", [False, True], ids=["alone", "guarded"])
@pytest.mark.parametrize("build", [_sd3, _flux, _pixart], ids=["sd3", "flux", "pixart"])
def test_dit_runs_on_fp8_weights_and_reverts_bit_exactly(build, guarded):
    torch.manual_seed(0)
    model, inputs = build()
    model.eval()
    with torch.no_grad():
        reference = model(**inputs).sample
        before = {k: (v, v.dtype, v.clone()) for k, v in model.state_dict(keep_vars=True).items()}
        fp32_bytes = mixprec.weight_bytes(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            with mixprec.apply(model, FP8) as applied:
                watcher = mixprec.guard(applied, on_nonfinite="fallback", remember=False) if guarded else None
                out = model(**inputs).sample
                if watcher is not None:
                    watcher.remove()
                    assert not watcher.pins, watcher.pins  # nothing overflows here: no fallback needed
                layers = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
                in_fp8 = [m for m in layers if m.weight.dtype == torch.float8_e4m3fn]
                ratio = applied.weight_bytes() / fp32_bytes
    assert len(in_fp8) >= len(layers) - 2  # all but the weights code reads (the first one, the model's dtype)
    assert ratio < 0.4, ratio
    sqnr = 10 * math.log10(reference.pow(2).sum().item() / (out.float() - reference).pow(2).sum().item())
    assert sqnr > 20, sqnr
    after = model.state_dict(keep_vars=True)
    assert all(after[k] is t and after[k].dtype == d and torch.equal(after[k], v) for k, (t, d, v) in before.items())
