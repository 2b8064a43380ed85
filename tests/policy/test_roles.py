"""Output heads by role, the models' own precision declarations, and explain's warnings."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mixprec
from mixprec.policy import Policy, PolicyError, Rule


class SpeakerEncoder(nn.Module):
    """A convolutional front end called ``head`` (as Chatterbox's CAMPPlus has), then a projection."""

    def __init__(self):
        super().__init__()
        self.head = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.BatchNorm1d(8), nn.ReLU(), nn.Conv1d(8, 8, 3, padding=1))
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.proj = nn.Linear(8, 6)

    def forward(self, x):
        h, _ = self.lstm(self.head(x).transpose(1, 2))
        return self.proj(h[:, -1])


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.block = nn.Linear(8, 8)
        self.lm_head = nn.Linear(8, 10)
        self.tail = nn.Linear(10, 10)  # defined last, but lm_head is a head by name too

    def forward(self, ids):
        return self.tail(self.lm_head(self.block(self.embed(ids))))


def test_balanced_pins_projections_that_are_heads_not_subnetworks_named_head(bf16_cpu):
    components = {"speaker": SpeakerEncoder(), "lm": LM()}
    policy = mixprec.preset("balanced", hardware=bf16_cpu)
    rows = {r["module"]: r for r in mixprec.explain(components, policy)}
    # The front end named "head" stays bf16 apart from its norm.
    assert rows["speaker.head.0"]["storage"] == "bf16" and rows["speaker.head.3"]["storage"] == "bf16"
    assert rows["speaker.head"]["storage"] == "bf16"
    # BatchNorm: torch's kernel accumulates bf16 in fp32, so no island for it under bf16
    assert rows["speaker.head.1"]["storage"] == "bf16"
    # The component's last projection and the named head are pinned by role.
    assert rows["speaker.proj"]["storage"] == "fp32" and rows["speaker.proj"]["rule"].endswith("role:head")
    assert rows["lm.lm_head"]["storage"] == "fp32" and rows["lm.tail"]["storage"] == "fp32"
    assert rows["lm.block"]["storage"] == "bf16"
    x = torch.randn(2, 4, 5)
    with mixprec.apply(components, policy), torch.no_grad():
        assert components["speaker"].proj.weight.dtype == torch.float32
        assert torch.isfinite(components["speaker"](x)).all()


def test_role_rules_validate_and_round_trip():
    with pytest.raises(PolicyError, match="unknown role"):
        Rule("role:heads", keep_fp32=True)
    policy = Policy((Rule("*", storage="bf16"), Rule("role:head", keep_fp32=True)), model_declarations=False)
    again = Policy.from_toml(policy.to_toml())
    assert again == policy and not again.model_declarations
    assert Policy.from_toml(Policy((Rule("*", storage="bf16"),)).to_toml()).model_declarations
    with pytest.raises(PolicyError, match="model_declarations"):
        Policy.from_dict({"model_declarations": "yes", "rules": []})


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2, decoder_start_token_id=0)
    return T5ForConditionalGeneration(config).eval()


def test_transformers_keep_in_fp32_modules_apply_under_fp16_only():
    t5 = _t5()
    assert "wo" in t5._keep_in_fp32_modules
    fp16 = {r["module"]: r for r in mixprec.explain(t5, Policy((Rule("*", storage="fp16"),)))}
    wo = "encoder.block.0.layer.1.DenseReluDense.wo"
    assert fp16[wo]["storage"] == "fp32" and fp16[wo]["rule"] == "model: T5ForConditionalGeneration._keep_in_fp32_modules of the model"
    assert fp16["encoder.block.0.layer.1.DenseReluDense.wi"]["storage"] == "fp16"
    bf16 = {r["module"]: r for r in mixprec.explain(t5, Policy((Rule("*", storage="bf16"),)))}
    assert bf16[wo]["storage"] == "bf16"  # not strict: bf16 has fp32's range
    off = {r["module"]: r for r in mixprec.explain(t5, Policy((Rule("*", storage="fp16"),), model_declarations=False))}
    assert off[wo]["storage"] == "fp16"
    ids = torch.tensor([[3, 4, 5, 1]])
    with mixprec.apply(t5, Policy((Rule("*", storage="fp16"),))), torch.no_grad():
        assert t5.encoder.block[0].layer[1].DenseReluDense.wo.weight.dtype == torch.float32
        out = t5(input_ids=ids, decoder_input_ids=torch.tensor([[0, 3]])).logits
    assert torch.isfinite(out).all()


def test_a_force_upcast_vae_stays_fp32_under_fp16():
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=(8,), norm_num_groups=4, latent_channels=2, sample_size=8).eval()
    assert vae.config.force_upcast
    plans = {r["module"]: r for r in mixprec.explain({"vae": vae}, Policy((Rule("vae", storage="fp16"),)))}
    assert plans["vae.decoder.conv_out"]["storage"] == "fp32"
    assert plans["vae"]["rule"] == "model: AutoencoderKL.config.force_upcast of vae"
    plans = {r["module"]: r for r in mixprec.explain({"vae": vae}, Policy((Rule("vae", storage="bf16"),)))}
    assert plans["vae.decoder.conv_out"]["storage"] == "bf16"


def test_explain_warns_when_app_code_reading_dtype_would_see_the_storage_type():
    components = {"speaker": SpeakerEncoder()}
    warnings = mixprec.explain_warnings(components, Policy((Rule("*", storage="bf16", compute="fp32"),)))
    assert len(warnings) == 1
    assert warnings[0].startswith("speaker computes in fp32 from bf16 weights")
    assert "speaker.dtype reads speaker.head.0" in warnings[0]
    fixed = Policy((Rule("*", storage="bf16", compute="fp32"), Rule("speaker.head.0", keep_fp32=True)))
    assert not any("speaker.dtype" in w for w in mixprec.explain_warnings(components, fixed))


def test_explain_warns_that_app_math_following_a_16bit_models_dtype_runs_in_16_bits():
    """16-bit storage with 16-bit compute: an app that casts its solver's state to model.dtype
    runs the whole ODE in 16 bits; explain says so, and a keep_fp32 rule on what the dtype
    is read from silences it."""
    components = {"speaker": SpeakerEncoder()}
    (warning,) = mixprec.explain_warnings(components, Policy((Rule("*", storage="bf16"),)))
    assert warning.startswith("speaker computes in bf16: code that reads its dtype gets bf16 (speaker.dtype reads "
                              "speaker.head.0") and "ODE solver" in warning
    fixed = Policy((Rule("*", storage="bf16"), Rule("speaker.head.0", keep_fp32=True)))
    assert mixprec.explain_warnings(components, fixed) == []
    assert mixprec.explain_warnings(components, Policy((Rule("*", storage="fp32"),))) == []


def _tiny_dit():
    from diffusers import DiTTransformer2DModel

    torch.manual_seed(0)
    return DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                                 num_layers=2, sample_size=8, patch_size=2, num_embeds_ada_norm=10).eval()


def test_role_norm_is_the_normalisation_not_the_modulation_an_adaptive_norm_owns(bf16_cpu):
    """diffusers' AdaLayerNormZero owns a large Linear beside its LayerNorm: a norm rule
    pins the LayerNorm and leaves the projection to the storage rule."""
    pytest.importorskip("diffusers")
    from mixprec.policy.roles import norm_layers

    dit = _tiny_dit()
    norms = norm_layers({"dit": dit})
    ada = dit.transformer_blocks[0].norm1
    assert type(ada).__name__ == "AdaLayerNormZero"
    assert id(ada) not in norms and id(ada.norm) in norms and id(ada.linear) not in norms
    pinned = Policy((Rule("*", storage="bf16"), Rule("role:norm", keep_fp32=True)))
    rows = {r["module"]: r for r in mixprec.explain({"dit": dit}, pinned)}
    assert rows["dit.transformer_blocks.0.norm1.linear"]["storage"] == "bf16"
    assert rows["dit.transformer_blocks.0.norm1.norm"]["compute"] == "fp32"
    fp32 = sum(p.numel() for n, p in dit.named_parameters() if rows[f"dit.{n.rpartition('.')[0]}"]["storage"] == "fp32")
    assert fp32 / sum(p.numel() for p in dit.parameters()) < 0.2  # was about 0.4: every adaptive norm's Linear


def test_role_head_skips_projections_inside_repeated_blocks():
    """A UNet's transformer blocks each have a ``proj_out``; only the UNet's ``conv_out`` is its head."""
    pytest.importorskip("diffusers")
    from diffusers import UNet2DConditionModel

    from mixprec.policy.roles import output_heads

    torch.manual_seed(0)
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(32, 64), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=16,
                                attention_head_dim=8, norm_num_groups=8)
    heads = output_heads({"unet": unet})
    names = {n for n, m in unet.named_modules() if id(m) in heads}
    assert names == {"conv_out"}
    assert any(n.endswith("proj_out") for n, _ in unet.named_modules())  # they exist, and are not heads
