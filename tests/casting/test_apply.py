from __future__ import annotations

import pytest
import torch
from torch import nn

import mixprec
from mixprec.device import backends
from mixprec.policy import Policy, PolicyError, Rule

BF16 = Policy((Rule("*", storage="bf16"),))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.out = nn.Linear(16, 8)
        self.register_buffer("steps", torch.arange(4))  # an integer buffer: never cast
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x):
        return self.out(self.norm(self.inp(x))) * self.scale


def _state(module):
    return {k: (v.dtype, v.device, v.requires_grad, v.detach().clone()) for k, v in
            list(module.named_parameters()) + list(module.named_buffers())}


def _same(module, state):
    now = _state(module)
    return now.keys() == state.keys() and all(
        a[:3] == b[:3] and torch.equal(a[3], b[3]) for a, b in ((now[k], state[k]) for k in state)
    )


@pytest.fixture
def block():
    torch.manual_seed(0)
    return Block()


def test_fp32_island_inside_bf16_runs_without_dtype_errors(block):
    x = torch.randn(3, 8)
    ref = block(x)
    policy = Policy((Rule("*", storage="bf16"), Rule("type:LayerNorm", keep_fp32=True)))
    with mixprec.apply(block, policy):
        assert block.inp.weight.dtype == torch.bfloat16 and block.norm.weight.dtype == torch.float32
        assert block.steps.dtype == torch.int64
        y = block(x)
    assert y.dtype == torch.float32  # the caller gets back the dtype it passed in
    assert torch.allclose(y, ref, atol=0.1, rtol=0.05)


@pytest.mark.parametrize("cast", [lambda m: m.half(), lambda m: m.to(torch.float16), lambda m: m.bfloat16()])
def test_keep_fp32_pins_survive_app_casts(block, cast):
    policy = Policy((Rule("*", storage="bf16"), Rule("norm", keep_fp32=True)))
    state = _state(block)
    applied = mixprec.apply(block, policy)
    cast(block)
    assert block.norm.weight.dtype == torch.float32 and block.norm.bias.dtype == torch.float32
    assert block.inp.weight.dtype in (torch.float16, torch.bfloat16)
    assert torch.isfinite(block(torch.randn(2, 8))).all()  # boundary casts follow the app's new dtype
    applied.revert()
    assert _same(block, state)
    block.half()
    assert block.norm.weight.dtype == torch.float16  # the pin is gone after revert


@pytest.mark.parametrize("keep", ["cpu", "disk"])
def test_revert_is_bit_exact(block, keep):
    block.inp.weight.requires_grad_(False)
    state = _state(block)
    applied = mixprec.apply(block, Policy((Rule("*", storage="fp16"), Rule("out", compute="fp32"))), keep_original=keep)
    assert applied.original_bytes == sum(t.numel() * 4 for t in list(block.parameters()) + [block.scale])
    block(torch.randn(2, 8))
    applied.revert()
    assert _same(block, state)
    assert not block._forward_hooks and not block._forward_pre_hooks
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in block.modules())


def test_keep_original_none_cannot_revert(block):
    applied = mixprec.apply(block, BF16, keep_original="none")
    assert applied.original_bytes == 0
    with pytest.raises(mixprec.RevertError, match="keep_original='none'"):
        applied.revert()
    assert all(not m._forward_pre_hooks for m in block.modules())


def test_apply_twice_is_an_error(block):
    with mixprec.apply(block, BF16):
        with pytest.raises(mixprec.ApplyError, match="already has a mixprec policy"):
            mixprec.apply(block, BF16)
    mixprec.apply(block, BF16).revert()  # fine again after revert


def test_tied_parameters_stay_tied():
    emb = nn.Embedding(10, 8)
    head = nn.Linear(8, 10, bias=False)
    head.weight = emb.weight
    model = nn.ModuleDict({"emb": emb, "head": head})
    state = _state(model)
    with mixprec.apply(model, BF16) as applied:
        assert model.head.weight is model.emb.weight and model.emb.weight.dtype == torch.bfloat16
        assert applied.original_bytes == 10 * 8 * 4  # counted once
    assert model.head.weight is model.emb.weight
    assert _same(model, state)


def test_unmatched_rule_warns_with_closest_names_or_errors_when_strict(block):
    policy = Policy((Rule("nrom", keep_fp32=True),))
    with pytest.warns(UserWarning, match=r"'nrom' matches no module; closest: 'norm'"):
        mixprec.apply(block, policy).revert()
    state = _state(block)
    with pytest.raises(PolicyError, match="matches no module"):
        mixprec.apply(block, policy, strict=True)
    assert _same(block, state) and not block.inp._forward_pre_hooks


def test_bad_target_and_options_change_nothing(block):
    state = _state(block)
    with pytest.raises(mixprec.ApplyError, match="keep_original='ram'; choose one of: cpu, disk, none"):
        mixprec.apply(block, BF16, keep_original="ram")
    with pytest.raises(mixprec.ApplyError, match="mixprec.apply: target must be an nn.Module, a mapping of named modules "
                                                 "or a pipeline, not int 3") as raised:
        mixprec.apply(3, BF16)
    assert isinstance(raised.value, TypeError)  # a wrong kind of argument, and the ApplyError it always was
    assert _same(block, state)


def test_fp32_compute_keeps_16bit_storage(block):
    x = torch.randn(2, 8)
    ref = block(x)
    with mixprec.apply(block, Policy((Rule("*", storage="fp16", compute="fp32"),))) as applied:
        y = block(x)
        assert block.inp.weight.dtype == torch.float16  # stored 16-bit between calls
        assert applied.weight_bytes() < mixprec.weight_bytes(Block())
    assert torch.allclose(y, ref, atol=5e-3)


def test_no_global_setting_leaks():
    """The full fp32_precision tree, legacy flags and default dtype are unchanged after revert."""
    model = Block()
    before = (backends.snapshot(), torch.get_default_dtype())
    policy = Policy((Rule("*", storage="bf16"),), numerics=mixprec.NumericSettings(matmul="medium", conv_tf32=False))
    applied = mixprec.apply(model, policy)
    assert torch.get_float32_matmul_precision() == "medium"
    model(torch.randn(1, 8))
    applied.revert()
    assert (backends.snapshot(), torch.get_default_dtype()) == before


class SelfCasting(nn.Module):
    """Casts its input to its parameters' dtype, as many real models do (``x.to(self.dtype)``)."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, batch_first=True)
        self.conv = nn.Conv1d(16, 4, 3, padding=1)

    def forward(self, x):
        out, _ = self.lstm(x.to(self.lstm.weight_ih_l0.dtype))
        return self.conv(out.transpose(1, 2)).float()


def test_fp32_compute_accepts_inputs_cast_to_the_storage_dtype():
    torch.manual_seed(0)
    model = SelfCasting()
    x = torch.randn(2, 5, 8)
    ref = model(x)
    with torch.no_grad():
        applied = mixprec.apply(model, Policy((Rule("*", storage="bf16", compute="fp32"),)))
        assert model.lstm.weight_ih_l0.dtype == torch.bfloat16
        out = model(x)  # the LSTM and the conv get bf16 input with fp32 compute
    assert out.dtype == torch.float32
    assert (out - ref).abs().max() < 0.05
    applied.revert()


def test_revert_restores_tensors_the_model_caches_as_plain_attributes():
    """ESPnet's ``pe`` pattern: a table re-made in bf16 during the applied run must not
    reach the first fp32 run after revert (which must equal one before apply, bit for bit)."""
    from realcode_models import EncoderWithCache

    import copy

    torch.manual_seed(0)
    model = EncoderWithCache().eval()
    untouched = copy.deepcopy(model)  # never applied: its first fp32 run is the reference
    x = torch.randn(2, 12, 8)
    table = model.pos.pe
    with mixprec.apply(model, Policy((Rule("*", storage="bf16"),))), torch.no_grad():
        model(x)
        assert model.pos.pe.dtype == torch.bfloat16 and model.pos.mask.dtype == torch.bfloat16
    assert model.pos.pe is table and model.pos.mask is None
    with torch.no_grad():
        assert torch.equal(model(x), untouched(x))


def test_revert_names_plain_tensors_changed_in_place():
    from realcode_models import EncoderWithCache

    model = EncoderWithCache().eval()
    applied = mixprec.apply(model, Policy((Rule("*", storage="bf16"),)))
    model.pos.pe.mul_(0.5)  # in place: the values cannot be put back
    with pytest.warns(UserWarning, match=r"cannot restore pos\.pe"):
        applied.revert()


def test_revert_restores_plain_tensors_made_under_inference_mode():
    """Apps run under torch.inference_mode(): its tensors keep no version counter."""
    from realcode_models import EncoderWithCache

    torch.manual_seed(0)
    model = EncoderWithCache().eval()
    x = torch.randn(2, 12, 8)
    with torch.inference_mode():
        model.pos.pe = model.pos.pe.clone()  # an inference tensor, as a first run under inference_mode makes it
        before = model(x)
        table = model.pos.pe
    with mixprec.apply(model, Policy((Rule("*", storage="bf16"),))), torch.inference_mode():
        model(x)
        table.mul_(2.0)  # changed in place: put back from the copy
    with torch.inference_mode():
        assert model.pos.pe is table and torch.equal(model(x), before)


class _RecordingLSTM(nn.LSTM):
    """A real LSTM that records the dtype of its weights whenever it is re-flattened."""

    def flatten_parameters(self) -> None:
        self.__dict__.setdefault("flattened", []).append(self.weight_ih_l0.dtype)
        super().flatten_parameters()


def test_rnn_weights_are_reflattened_after_cast_and_after_revert():
    """Weights swapped one by one leave cuDNN's flat buffer; apply and revert rebuild it."""
    model = nn.Sequential(_RecordingLSTM(8, 16, batch_first=True))
    model[0].flattened = []
    before = {k: v.clone() for k, v in model.state_dict().items()}
    applied = mixprec.apply(model, Policy((Rule("*", storage="bf16"),)))
    assert model[0].flattened == [torch.bfloat16]
    applied.revert()
    assert model[0].flattened == [torch.bfloat16, torch.float32]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN's flat RNN weights need a CUDA GPU")
def test_cast_rnn_on_cuda_warns_nothing_and_reverts_bit_exactly():
    import warnings

    torch.manual_seed(0)
    model = nn.Sequential(nn.LSTM(32, 64, batch_first=True), nn.GRU(64, 64, batch_first=True)).cuda()

    class Run(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner[1](self.inner[0](x)[0])[0]

    net = Run(model)
    x = torch.randn(2, 10, 32, device="cuda")
    with torch.no_grad():
        reference = net(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "RNN module weights are not part of single contiguous chunk"
            with mixprec.apply(net, Policy((Rule("*", storage="bf16"),))):
                assert net(x).dtype == torch.float32
            assert torch.equal(net(x), reference)
