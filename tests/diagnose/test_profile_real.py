"""``mixprec.profile`` on the real Chatterbox S3Gen modules (chatterbox-tts), random weights.

S3Gen draws random numbers inside its forward passes (the flow decoder's starting noise
with ``randn_like``, the vocoder's sine source with ``Uniform`` and ``randn_like``) and is
run here under bf16 storage with fp32 compute, the case in which every module's own
error used to be missing and the fp32 and policy runs drew different noise.
"""

from __future__ import annotations

import math

import pytest
import torch

import mixprec
from mixprec.policy import Policy, Rule

pytest.importorskip("chatterbox.models.s3gen")
from chatterbox.models.s3gen.decoder import ConditionalDecoder  # noqa: E402
from chatterbox.models.s3gen.f0_predictor import ConvRNNF0Predictor  # noqa: E402
from chatterbox.models.s3gen.flow_matching import CausalConditionalCFM  # noqa: E402
from chatterbox.models.s3gen.configs import CFM_PARAMS  # noqa: E402
from chatterbox.models.s3gen.hifigan import HiFTGenerator  # noqa: E402

BF16_FP32 = Policy((Rule("*", storage="bf16", compute="fp32"),))


def _check(prof: mixprec.Profile, noisy: str) -> None:
    stats = {s.module: s for s in prof.modules}
    # Modules the policy leaves in fp32 (the weights a model's own dtype property reads,
    # such as the flow decoder's final_proj) have no 16-bit copy to compare.
    owners = [s for s in prof.modules if s.calls and _owns_weights(s.module) and "bf16" in (s.storage, s.compute)]
    assert owners and all(s.own_sqnr_db is not None for s in owners)
    # bf16 weights with fp32 arithmetic: about 50-56 dB per module
    assert min(s.own_sqnr_db for s in owners) > 40
    assert not any(s.pairing_mismatch or s.int_inputs_differ for s in prof.modules)
    inherited = [s.inherited_sqnr_db for s in prof.modules if s.inherited_sqnr_db is not None]
    assert len(inherited) == len([s for s in prof.modules if s.output_absmax > 0])
    assert min(inherited) > 20, sorted((s.inherited_sqnr_db, s.module) for s in prof.modules
                                       if s.inherited_sqnr_db is not None)[:5]
    assert stats[noisy].inherited_sqnr_db > 20  # noise against the same noise
    assert prof.output_sqnr_db is not None and prof.output_sqnr_db > 20


_MODULES: dict[str, torch.nn.Module] = {}


def _owns_weights(name: str) -> bool:
    module = _MODULES[name]
    return any(p.is_floating_point() for p in module.parameters(recurse=False))


def _register(comps: dict[str, torch.nn.Module]) -> None:
    for cname, root in comps.items():
        for name, module in root.named_modules():
            _MODULES[f"{cname}.{name}" if name else cname] = module


def test_s3gen_vocoder_under_bf16_storage_fp32_compute():
    torch.manual_seed(0)
    # S3Gen's mel2wav, as chatterbox.models.s3gen.S3Gen builds it
    hift = HiFTGenerator(sampling_rate=24000, upsample_rates=[8, 5, 3], upsample_kernel_sizes=[16, 11, 7],
                         source_resblock_kernel_sizes=[7, 7, 11],
                         source_resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5], [1, 3, 5]],
                         f0_predictor=ConvRNNF0Predictor()).eval()
    comps = {"mel2wav": hift}
    _register(comps)
    mel = torch.randn(1, 80, 8)
    before = torch.get_rng_state()
    # layers only: the full-size vocoder's blocks would each run again per call (the flow
    # decoder below covers blocks on real code)
    prof = mixprec.profile(comps, mel, BF16_FP32, run=lambda m: hift.inference(speech_feat=m)[0], blocks=False)
    assert torch.equal(torch.get_rng_state(), before)
    _check(prof, "mel2wav.m_source.l_sin_gen")


def test_s3gen_flow_decoder_under_bf16_storage_fp32_compute():
    torch.manual_seed(0)
    # S3Gen's flow decoder (CausalConditionalCFM draws its start with randn_like) with a
    # smaller estimator of the same class
    estimator = ConditionalDecoder(in_channels=320, out_channels=80, causal=True, channels=[64], dropout=0.0,
                                   attention_head_dim=16, n_blocks=1, num_mid_blocks=2, num_heads=2, act_fn="gelu")
    decoder = CausalConditionalCFM(spk_emb_dim=80, cfm_params=CFM_PARAMS, estimator=estimator).eval()
    comps = {"decoder": decoder}
    _register(comps)
    frames = 24
    g = torch.Generator().manual_seed(1)
    mu, cond = torch.randn(1, 80, frames, generator=g), torch.randn(1, 80, frames, generator=g)
    spks, mask = torch.randn(1, 80, generator=g), torch.ones(1, 1, frames)

    def run(_):
        return decoder(mu=mu, mask=mask, n_timesteps=2, spks=spks, cond=cond)[0]

    prof = mixprec.profile(comps, None, BF16_FP32, run=run)
    _check(prof, "decoder")
    assert {s.module: s.calls for s in prof.modules}["decoder.estimator.final_proj"] == 2
    assert math.isfinite(prof.output_sqnr_db)
    # blocks of real code get their own error too: a copy of the block on its fp32 input
    blocks = {s.module: s for s in prof.modules if not s.owns_weights and s.own_sqnr_db is not None}
    for name in ("decoder", "decoder.estimator.down_blocks.0.1.0", "decoder.estimator.mid_blocks.0.0"):
        assert 20 < blocks[name].own_sqnr_db < 120 and blocks[name].own_skipped is None, name
