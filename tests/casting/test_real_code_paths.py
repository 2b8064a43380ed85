"""Policies on model code written the way real apps write it (see realcode_models.py).

Each test reproduces a failure seen on the real Chatterbox classes: tensors created
inside a forward, conditioning in dataclasses, rules on ModuleLists, methods other than
``forward``, app code casting to ``self.dtype`` before ops without 16-bit kernels, and
noise drawn inside the call.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

import mixprec
from mixprec.device import backends
from mixprec.diagnose.fallbacks import FallbackStore
from mixprec.policy import Policy, Rule

from guard_models import KeywordOnlyMLP, assert_fallback_output, overflowing_lyric_encoder, tokens
from realcode_models import SmoothingCodec, codec_latents, tiny_codec, tiny_tts, tts_inputs
from spectral_models import spectral_vocoder

BF16 = Policy((Rule("*", storage="bf16"),), name="bf16")
FP16_FP32 = Policy((Rule("*", storage="fp16", compute="fp32"),), name="fp16-fp32c")
BF16_FP32 = Policy((Rule("*", storage="bf16", compute="fp32"),), name="bf16-fp32c")
POLICIES = [BF16, FP16_FP32, BF16_FP32]
# Without the models' own declarations, TinyTTS.dtype's source is not pinned: its
# embed_ref casts to bf16 and fails, as app code does under any plain bf16 cast.
BF16_UNDECLARED = Policy((Rule("*", storage="bf16"),), name="bf16", model_declarations=False)


def _tensors(module):
    return {k: v.detach().clone() for k, v in list(module.named_parameters()) + list(module.named_buffers())}


def _bit_exact(module, before):
    now = dict(list(module.named_parameters()) + list(module.named_buffers()))
    return all(now[k].dtype == v.dtype and torch.equal(now[k], v) for k, v in before.items())


def _hooks(module):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


def _sqnr(test, ref):
    return float(10 * torch.log10(ref.pow(2).sum() / (test.float() - ref).pow(2).sum()))


@pytest.fixture
def store(tmp_path):
    return FallbackStore(tmp_path / "fallbacks.json")


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
@pytest.mark.parametrize("entry", ["forward", "inference"])
def test_inputs_made_inside_forwards_and_carried_in_dataclasses_reach_each_layer_in_its_dtype(policy, entry):
    model = tiny_tts()
    emb, cond, f0 = tts_inputs()
    with torch.no_grad():
        ref = model(emb, cond, f0=f0)
    before, flags, hooks = _tensors(model), backends.snapshot(), _hooks(model)
    with mixprec.apply(model, policy), torch.no_grad():
        out = model(emb, cond, f0=f0) if entry == "forward" else model.inference(emb, cond, f0)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert _sqnr(out, ref) > 20
    assert _bit_exact(model, before) and backends.snapshot() == flags and _hooks(model) == hooks
    assert not any(k in m.__dict__ for m in model.modules() for k in ("forward", "inference"))


BF16_FP32_VOCODER = Policy((Rule("*", storage="bf16"), Rule("backbone.vocoder", keep_fp32=True)), name="bf16-fp32-vocoder")


@pytest.mark.parametrize("policy", [BF16, FP16_FP32, BF16_FP32_VOCODER], ids=lambda p: p.name)
@pytest.mark.parametrize("method", ["decode", "decode_smoothed"])
def test_a_component_methods_body_is_app_code_and_gets_the_dtype_fp32_would_give(policy, method):
    """MusicDCAE.decode's pattern: modules reached at any depth from a component method
    (a grandchild's own ``decode``, a grandchild's forward, an fp32 island) hand back fp32,
    so torchaudio's resampling and a kernel the method makes in fp32 take them."""
    pytest.importorskip("torchaudio")
    model, latents = tiny_codec(), codec_latents()
    with torch.no_grad():
        ref = getattr(model, method)(latents)
    before, hooks = _tensors(model), _hooks(model)
    computed: list[torch.dtype] = []
    probe = model.backbone.vocoder.out.register_forward_pre_hook(lambda m, args: computed.append(args[0].dtype))
    with mixprec.apply(model, policy), torch.no_grad():
        out = getattr(model, method)(latents)
    probe.remove()
    assert out.dtype == torch.float32 and _sqnr(out, ref) > 40
    # the vocoder still computes in its own dtype: only what reaches app code is widened
    assert computed == [torch.float32 if policy is BF16_FP32_VOCODER or policy is FP16_FP32 else torch.bfloat16]
    assert _bit_exact(model, before) and _hooks(model) == hooks
    assert not any(k in m.__dict__ for m in model.modules() for k in ("forward", "decode", "_mixprec_method_hooks"))


def test_module_code_inside_a_16bit_component_keeps_its_16bit_activations():
    """The app-code rule changes nothing inside forwards: a block's output reaches its parent in 16 bits."""
    model, latents = tiny_codec(), codec_latents()
    seen: list[torch.dtype] = []
    hook = model.backbone.vocoder.register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    with mixprec.apply(model, BF16), torch.no_grad():
        out = model(latents)  # forward: the decoder hands the vocoder bf16, as before
    hook.remove()
    assert seen == [torch.bfloat16] and out.dtype == torch.float32


@pytest.mark.flops16_off("the error names the line that raised, the traceback's last frame: under a dispatch mode "
                         "that is torch's, so the 16-bit FLOP counter would change what this test reads")
def test_a_dtype_error_in_a_forwards_own_code_widens_only_what_reached_it(store, caplog):
    """An op in a component's forward mixes the vocoder's 16-bit output with a kernel it made
    in fp32: the guard hands on that one output in fp32 (the vocoder still computes in bf16)
    instead of pinning the vocoder or the component, and remembers it."""
    torch.manual_seed(0)
    model, latents = SmoothingCodec().eval(), codec_latents()
    with torch.no_grad():
        ref = model(latents)
    before = _tensors(model)
    applied = mixprec.apply({"codec": model}, BF16)
    with pytest.warns(UserWarning, match=r"in component 'codec' \(forward\).*torch\.conv1d \(bfloat16 and float32, called "
                                         r"from .*realcode_models\.py:\d+ \(forward\)\).*run in the wider dtype \(float32\)"):
        with torch.no_grad():
            alone = model(latents)  # apply alone: the op that refuses bf16 with fp32 runs in fp32
    assert alone.dtype == torch.float32 and _sqnr(alone, ref) > 40
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once; later calls widen without re-running
        with torch.no_grad():
            assert torch.equal(model(latents), alone)
    watching = mixprec.guard(applied, on_nonfinite="raise", remember=False)
    with pytest.raises(mixprec.PrecisionDtypeError, match=r"(?s)in codec \(SmoothingCodec\.forward.*by `return torch\.nn\."
                                                          r"functional\.conv1d\(wav.*output_dtype = \"fp32\""), torch.no_grad():
        model(latents)  # raise: names the module, the line with the op, and the narrow fix
    watching.remove()
    guard = mixprec.guard(applied, on_nonfinite="fallback", store=store)
    with pytest.warns(UserWarning, match=r"handed on the output of codec\.backbone\.vocoder in fp32"), torch.no_grad():
        out = model(latents)
    assert {k: p.dtype for k, p in guard.pins.items()} == {"codec.backbone.vocoder": "fp32-output"}
    assert _sqnr(out, ref) > 40
    assert model.backbone.vocoder.out.weight.dtype == torch.bfloat16  # it still computes in bf16
    applied.revert()
    assert _bit_exact(model, before)

    applied = mixprec.apply({"codec": model}, BF16)  # the next start: remembered, no fallback needed
    with caplog.at_level(logging.INFO, logger="mixprec"):
        again = mixprec.guard(applied, on_nonfinite="fallback", store=store)
    assert "codec.backbone.vocoder pinned to fp32-output" in caplog.text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            assert torch.equal(model(latents), out)
    assert not again.reports
    applied.revert()


def test_casts_never_change_the_callers_objects():
    model = tiny_tts()
    emb, cond, f0 = tts_inputs()
    batch = {"x": emb}
    speaker = cond.speaker_emb
    with mixprec.apply(model, BF16), torch.no_grad():
        model(batch["x"], cond, f0=f0)
        model.cond_enc(cond)
    assert batch["x"] is emb and emb.dtype == torch.float32
    assert cond.speaker_emb is speaker and speaker.dtype == torch.float32


def test_dict_argument_is_cast_into_a_new_dict():
    class TakesDict(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, batch):
            return self.lin(batch["x"])

    model = TakesDict()
    batch = {"x": torch.randn(2, 4)}
    x = batch["x"]
    with mixprec.apply(model, BF16), torch.no_grad():
        out = model(batch)
    assert out.dtype == torch.float32
    assert batch["x"] is x and x.dtype == torch.float32


def test_a_rule_on_a_module_list_reaches_its_children():
    model = tiny_tts()
    emb, cond, f0 = tts_inputs()
    policy = Policy((Rule("*", storage="bf16"), Rule("vocoder.downs", keep_fp32=True)))
    with mixprec.apply(model, policy) as applied, torch.no_grad():
        assert model.vocoder.downs[0].weight.dtype == torch.float32
        assert model.vocoder.pre.weight.dtype == torch.bfloat16
        out = model.inference(emb, cond, f0)
        assert torch.isfinite(out).all()
        rows = {r["module"]: r for r in applied.explain()}
    assert rows["vocoder.downs.1"]["compute"] == "fp32"


@pytest.mark.parametrize("policy", [BF16, FP16_FP32], ids=lambda p: p.name)
def test_ops_without_16bit_kernels_in_model_code_run_in_fp32(policy):
    model = spectral_vocoder()
    mel = torch.randn(1, 8, 20, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(mel)
    before = _tensors(model)
    with mixprec.apply(model, policy), torch.no_grad():
        by_forward = model(mel)
        by_method = model.inference(mel)  # head reached through .forward: its own scope
    assert torch.isfinite(by_forward).all() and torch.allclose(by_forward, by_method, atol=1e-2)
    assert _sqnr(by_forward, ref) > 15
    assert _bit_exact(model, before)


def test_the_weights_a_dtype_property_reads_are_kept_fp32():
    model = tiny_tts()
    ref_audio = torch.randn(1, 6, 8)
    with torch.no_grad():
        expected = model.embed_ref(ref_audio)
    with mixprec.apply({"tts": model}, BF16) as applied, torch.no_grad():
        rows = {r["module"]: r for r in applied.explain()}
        assert rows["tts.vocoder.source.l_linear"]["storage"] == "fp32"
        assert rows["tts.vocoder.source.l_linear"]["rule"].startswith("model: TinyTTS.dtype of tts reads its weights")
        assert model.dtype == torch.float32 and model.proj.weight.dtype == torch.bfloat16
        assert torch.allclose(model.embed_ref(ref_audio), expected, atol=1e-5)


def test_dtype_error_in_app_code_names_the_module_rule_and_fix(store):
    model = tiny_tts()
    ref_audio = torch.randn(1, 6, 8)
    applied = mixprec.apply({"tts": model}, BF16_UNDECLARED)
    mixprec.guard(applied, on_nonfinite="raise", store=store)
    with pytest.raises(mixprec.PrecisionDtypeError) as excinfo, torch.no_grad():
        model.embed_ref(ref_audio)
    report = excinfo.value.report
    assert report.module == "tts" and report.method == "embed_ref" and report.type == "TinyTTS"
    assert report.storage == "bf16" and report.compute == "bf16" and report.rule == "#0 '*'"
    assert "cdist" in report.error and "realcode_models.py" in report.where
    message = str(excinfo.value)
    assert 'match = "tts"' in message and "keep_fp32 = true" in message
    assert isinstance(excinfo.value.__cause__, RuntimeError)
    applied.revert()


def test_dtype_error_fallback_pins_what_self_dtype_reads_and_remembers_it(store, tmp_path, caplog):
    model = tiny_tts()
    ref_audio = torch.randn(1, 6, 8)
    with torch.no_grad():
        expected = model.embed_ref(ref_audio)
    applied = mixprec.apply({"tts": model}, BF16_UNDECLARED)
    guard = mixprec.guard(applied, on_nonfinite="fallback", store=store)
    with pytest.warns(UserWarning, match=r"pinned tts\.vocoder\.source\.l_linear -> fp32"), torch.no_grad():
        out = model.embed_ref(ref_audio)
    assert torch.allclose(out, expected, atol=1e-5)
    # Narrower than the component: one small layer, the first parameter self.dtype reads.
    assert set(guard.pins) == {"tts.vocoder.source.l_linear"}
    pin = guard.pins["tts.vocoder.source.l_linear"]
    assert pin.dtype == "fp32" and pin.source == "fallback" and "cdist" in pin.reason
    assert model.proj.weight.dtype == torch.bfloat16 and model.dtype == torch.float32
    with torch.no_grad():
        emb, cond, f0 = tts_inputs()
        assert torch.isfinite(model.inference(emb, cond, f0)).all()
    guard.remove()
    applied.revert()

    # The next start pins it before the first call, and says so.
    applied = mixprec.apply({"tts": model}, BF16_UNDECLARED)
    with caplog.at_level(logging.INFO, logger="mixprec"):
        again = mixprec.guard(applied, on_nonfinite="fallback", store=store)
    assert again.pins["tts.vocoder.source.l_linear"].source == "remembered"
    assert again.pins["tts.vocoder.source.l_linear"].learned == pin.learned
    assert any("tts.vocoder.source.l_linear pinned to fp32, remembered from a fallback learned" in r.getMessage()
               for r in caplog.records)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback needed this time
        with torch.no_grad():
            model.embed_ref(ref_audio)
    again.remove()
    applied.revert()


def test_a_model_error_that_fp32_does_not_fix_is_reraised_unchanged(store):
    class Broken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.cdist(self.lin(x).to(torch.bfloat16), x.to(torch.bfloat16))  # fails in fp32 too

    model = Broken()
    x = torch.randn(2, 3, 4)
    # What the model raises on its own: NotImplementedError on torch 2.13, RuntimeError on 2.6.
    with pytest.raises(RuntimeError, match="cdist") as alone, torch.no_grad():
        model(x)
    applied = mixprec.apply({"m": model}, BF16)
    guard = mixprec.guard(applied, on_nonfinite="fallback", store=store)
    policy = applied.policy
    with pytest.raises(RuntimeError, match="cdist") as excinfo, torch.no_grad():
        model(x)
    assert type(excinfo.value) is type(alone.value) and str(excinfo.value) == str(alone.value)
    assert "model's own error, not a precision problem" in "".join(getattr(excinfo.value, "__notes__", []))
    assert applied.policy is policy and guard.pins == {} and store.load() == {}
    assert model.lin.weight.dtype == torch.bfloat16
    applied.revert()


def test_guard_checks_component_methods_that_bypass_forward(store):
    lyrics = overflowing_lyric_encoder()

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = lyrics

        def synthesize(self, x):
            return self.model.forward(x)  # no hook of the holder or of the model fires

    holder = Holder()
    applied = mixprec.apply({"app": holder}, Policy((Rule("*", storage="fp16"),)))
    mixprec.guard(applied, on_nonfinite="raise", store=store)
    with pytest.raises(mixprec.NonFiniteError) as excinfo, torch.no_grad():
        holder.synthesize(tokens())
    assert excinfo.value.report.module == "app.model.blocks.2.mlp"
    applied.revert()


def test_fallback_rerun_draws_the_same_noise_as_a_clean_run(store):
    lyrics = overflowing_lyric_encoder()

    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = lyrics

        def forward(self, x):
            h = self.model(x)
            return h + torch.randn_like(h)  # flow matching draws its noise inside the call

    noisy = Noisy()
    applied = mixprec.apply({"app": noisy}, Policy((Rule("*", storage="fp16"),)))
    mixprec.guard(applied, on_nonfinite="fallback", store=store)
    torch.manual_seed(123)
    with pytest.warns(UserWarning, match="pinned"), torch.no_grad():
        recovered = noisy(tokens())
    torch.manual_seed(123)
    with torch.no_grad():
        clean = noisy(tokens())  # same pins, no fallback needed now
    assert torch.equal(recovered, clean)
    applied.revert()


def test_a_keyword_only_call_is_rerun_with_the_callers_fp32_inputs(store):
    model = KeywordOnlyMLP()
    x = torch.ones(2, 4)
    with torch.no_grad():
        expected = model(x=x)
    applied = mixprec.apply({"m": model}, Policy((Rule("*", storage="fp16"),)))
    guard = mixprec.guard(applied, on_nonfinite="fallback", store=store)
    with pytest.warns(UserWarning, match="pinned"), torch.no_grad():
        out = model(x=x)
    assert_fallback_output(out, expected, guard)
    assert x.dtype == torch.float32 and guard.pins
    applied.revert()


def test_overflow_report_names_the_16bit_module_that_consumes_an_fp32_value(store):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.big = torch.nn.Linear(4, 4)
            self.out = torch.nn.Linear(4, 4)
            with torch.no_grad():
                self.big.weight.fill_(3e4)

        def forward(self, x):
            return self.out(self.big(x))

    net = Net()
    applied = mixprec.apply({"net": net}, Policy((Rule("*", storage="fp16"), Rule("net.big", keep_fp32=True))))
    mixprec.guard(applied, on_nonfinite="raise", store=store)
    with pytest.raises(mixprec.NonFiniteError) as excinfo, torch.no_grad():
        net(torch.ones(1, 4))
    report = excinfo.value.report
    assert report.module == "net.big" and report.dtype == "fp32" and report.reason == "beyond dtype range"
    assert report.consumer == "net" and report.limit_dtype == "fp16" and report.dtype_max == 65504.0
    assert "cannot be represented in fp16 (max 65504), the compute dtype of net, which consumes it" in str(excinfo.value)
    assert "fp32 max" not in str(excinfo.value)
    applied.revert()
