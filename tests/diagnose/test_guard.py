from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import mixprec
from mixprec import pipelines
from mixprec.diagnose.fallbacks import FallbackStore
from mixprec.diagnose.overflow import all_finite
from mixprec.policy import Policy, Rule

from guard_models import overflowing_lyric_encoder, tokens

FP16 = Policy((Rule("*", storage="fp16"),))


@pytest.fixture
def store(tmp_path):
    return FallbackStore(tmp_path / "fallbacks.json")


def test_all_finite_ignores_integer_and_non_tensor_outputs():
    assert all_finite((torch.tensor([1, 2]), torch.tensor([True]), "text", None, {"x": torch.ones(2)}))
    assert not all_finite([torch.ones(2), {"y": torch.tensor([1.0, math.inf])}])


def test_raise_names_exactly_the_overflowing_module(store):
    model = overflowing_lyric_encoder()
    applied = mixprec.apply({"lyrics": model}, FP16)
    mixprec.guard(applied, on_nonfinite="raise", store=store)
    with pytest.raises(mixprec.NonFiniteError) as excinfo, torch.no_grad():
        model(tokens())
    report = excinfo.value.report
    assert report.module == "lyrics.blocks.2.mlp"
    assert report.type == "GatedProjection" and report.dtype == "fp16" and report.dtype_max == 65504.0
    assert not math.isfinite(report.output_absmax) and 0 < report.input_absmax < 100
    assert "lyrics.blocks.2.mlp (GatedProjection, fp16)" in str(excinfo.value)
    applied.revert()


def test_fallback_pins_only_that_module_and_matches_fp32(store):
    model = overflowing_lyric_encoder()
    x = tokens()
    with torch.no_grad():
        reference = model(x)
    applied = mixprec.apply({"lyrics": model}, FP16)
    guard = mixprec.guard(applied, on_nonfinite="fallback", store=store)
    with pytest.warns(UserWarning, match=r"lyrics.blocks.2.mlp .*pinned lyrics.blocks.2.mlp -> (bf16|fp32)"), torch.no_grad():
        out = model(x)
    assert guard.pins.keys() == {"lyrics.blocks.2.mlp"}
    assert torch.isfinite(out).all()
    assert torch.allclose(out.float(), reference, atol=5e-2)
    plans = {p.qualname: p for p in applied.plans}
    assert plans["lyrics.blocks.2.mlp"].storage in ("bf16", "fp32")
    assert plans["lyrics.blocks.1.mlp"].storage == "fp16"  # nothing else changed
    assert store.get(guard.fingerprint) == {m: p.dtype for m, p in guard.pins.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            model(x)  # pinned now: no second fallback
    applied.revert()


def test_warn_mode_reports_and_returns_the_output(store):
    model = overflowing_lyric_encoder()
    applied = mixprec.apply({"lyrics": model}, FP16)
    guard = mixprec.guard(applied, on_nonfinite="warn", store=store)
    with pytest.warns(UserWarning, match="non-finite output: lyrics.blocks.2.mlp"), torch.no_grad():
        out = model(tokens())
    assert not torch.isfinite(out).all() and len(guard.reports) == 1
    applied.revert()


def test_model_errors_are_the_models_own(store):
    model = overflowing_lyric_encoder()
    applied = mixprec.apply({"lyrics": model}, FP16)
    mixprec.guard(applied, on_nonfinite="fallback", store=store)
    with pytest.raises(IndexError), torch.no_grad():
        model(torch.full((1, 3), 999))  # token id out of the embedding's range
    applied.revert()


def test_bad_arguments():
    model = overflowing_lyric_encoder()
    with mixprec.apply(model, FP16) as applied:
        with pytest.raises(ValueError, match="unknown guard mode 'all'; choose one of: components, modules, off"):
            mixprec.guard(applied, mode="all")
        with pytest.raises(ValueError, match="unknown on_nonfinite 'ignore'"):
            mixprec.guard(applied, on_nonfinite="ignore")
    with pytest.raises(TypeError, match=r"mixprec.guard: applied must be an Applied \(what mixprec.apply returns\)"):
        mixprec.guard(model)


NEXT_START = textwrap.dedent("""
    import json, sys, warnings, torch, mixprec
    sys.path.insert(0, {tests!r})
    from guard_models import overflowing_lyric_encoder, tokens
    from mixprec.policy import Policy, Rule
    model = overflowing_lyric_encoder()
    applied = mixprec.apply({{"lyrics": model}}, Policy((Rule("*", storage="fp16"),)))
    guard = mixprec.guard(applied, on_nonfinite="fallback", store=mixprec.FallbackStore({store!r}))
    pinned_before_first_call = {{m: p.dtype for m, p in guard.pins.items()}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            out = model(tokens())
    print(json.dumps({{"before": pinned_before_first_call, "warnings": [str(w.message) for w in caught],
                      "finite": bool(torch.isfinite(out).all())}}))
""")


def test_next_process_start_reapplies_the_pin_without_a_failing_call(tmp_path):
    script = tmp_path / "app.py"
    script.write_text(NEXT_START.format(tests=str(Path(__file__).parents[1]), store=str(tmp_path / "fallbacks.json")))
    env = {"MIXPREC_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}

    def start():
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    first, second = start(), start()
    assert first["before"] == {} and first["finite"]
    assert any("pinned lyrics.blocks.2.mlp" in w for w in first["warnings"])
    assert second["before"] == {"lyrics.blocks.2.mlp": next(iter(second["before"].values()))}
    assert second["warnings"] == [] and second["finite"]


def test_diffusion_vae_overflow_is_found_and_fixed(store):
    pipe = pipelines.get("diffusion", size="test", seed=0)
    conv = pipe.components["vae"].decoder.up_blocks[0].resnets[0].conv1
    inputs = pipe.example_inputs(1, 0)
    seen = []
    handle = conv.register_forward_hook(lambda m, a, o: seen.append(o.abs().max().item()))
    pipe.run(inputs)
    handle.remove()
    with torch.no_grad():
        conv.weight.mul_(2e5 / max(seen))  # inject: this block now reaches ~2e5, beyond fp16
        conv.bias.mul_(2e5 / max(seen))
    reference = pipe.run(inputs).output
    assert torch.isfinite(reference).all()

    # The VAE declares force_upcast (diffusers runs it in fp32 when fp16): turn the
    # model's own declarations off to reproduce the overflow it guards against.
    policy = Policy((Rule("vae", storage="fp16"),), model_declarations=False)
    with mixprec.apply(pipe, policy) as applied:
        assert not torch.isfinite(pipe.run(inputs).output).all()  # the failure, unguarded
        guard = mixprec.guard(applied, on_nonfinite="raise", store=store)
        with pytest.raises(mixprec.NonFiniteError) as excinfo:
            pipe.run(inputs)
        assert excinfo.value.report.module == "vae.decoder.up_blocks.0.resnets.0.conv1"
        guard.remove()
        guard = mixprec.guard(applied, on_nonfinite="fallback", store=store)
        with pytest.warns(UserWarning, match="vae.decoder.up_blocks.0.resnets.0.conv1"):
            out = pipe.run(inputs).output
        assert torch.isfinite(out).all()
        assert set(guard.pins) <= {"vae.decoder.up_blocks.0.resnets.0.conv1", "vae.decoder.up_blocks.0.resnets.0"}
        assert (out - reference).abs().max() < 0.05


def test_kv_cache_is_rewound_for_the_rerun(store):
    """An overflow inside the TTS backbone's decoding loop: the re-run must not append to the KV cache twice."""
    pipe = pipelines.get("tts", size="test", seed=0)
    mlp = pipe.components["t3"].model.layers[0].mlp
    with torch.no_grad():
        mlp.up_proj.weight.mul_(1e6)
        mlp.down_proj.weight.div_(1e6)
    inputs = pipe.example_inputs(1, 0)
    reference = pipe.run(inputs)
    with mixprec.apply(pipe, Policy((Rule("t3", storage="fp16"),))) as applied:
        unguarded = pipe.run(inputs, speech_tokens=reference.speech_tokens)
        assert unguarded.token_agreement < 0.5  # fp16 overflow wrecks the backbone's logits
        guard = mixprec.guard(applied, on_nonfinite="fallback", store=store)
        with pytest.warns(UserWarning, match="t3.model.layers.0.mlp"):
            out = pipe.run(inputs, speech_tokens=reference.speech_tokens)
        assert torch.isfinite(out.output).all()
        assert out.token_agreement >= 0.9
        assert out.output.shape == reference.output.shape
        assert guard.pins


def test_rerun_starts_from_the_same_kv_cache_length(store):
    from transformers import DynamicCache

    pipe = pipelines.get("tts", size="test", seed=0)
    t3 = pipe.components["t3"]
    mlp = t3.model.layers[0].mlp
    with torch.no_grad():
        mlp.up_proj.weight.mul_(1e6)
        mlp.down_proj.weight.div_(1e6)
    ids = torch.randint(0, 16, (1, 7), generator=torch.Generator().manual_seed(0))
    with mixprec.apply({"t3": t3}, Policy((Rule("t3", storage="fp16"),))) as applied:
        mixprec.guard(applied, on_nonfinite="fallback", store=store)
        cache = DynamicCache()
        with pytest.warns(UserWarning, match="pinned"), torch.no_grad():
            out = t3(input_ids=ids, past_key_values=cache, use_cache=True)
        assert torch.isfinite(out.logits).all()
        assert cache.get_seq_length() == 7  # not 14: the failed call's keys were cropped first


def test_fallbacks_cli_lists_and_clears():
    from typer.testing import CliRunner

    from mixprec.cli import app

    default = FallbackStore()
    default.remember("abc123", "vae.decoder.conv_out", "bf16", "vae")
    runner = CliRunner()
    listed = runner.invoke(app, ["fallbacks", "list", "--json"])
    assert listed.exit_code == 0
    assert json.loads(listed.stdout)["fallbacks"]["abc123"]["pins"] == {"vae.decoder.conv_out": "bf16"}
    cleared = runner.invoke(app, ["fallbacks", "clear", "abc123"])
    assert cleared.exit_code == 0 and "removed 1" in cleared.output
    assert default.load() == {}


class _CastingNorm(torch.nn.LayerNorm):
    """Normalises ``x.float()`` and casts back, as whisper's LayerNorm does (fails on bf16 weights)."""

    def forward(self, x):
        return super().forward(x.float()).type(x.dtype)


class _HookCachedDecoder(torch.nn.Module):
    """Attends over keys that forward hooks on ``key`` gather into a dict or list the app
    hands to every call (whisper's ``kv_cache``); the key is projected before the layers
    that fail, so a failed call has already grown the cache."""

    def __init__(self, norm: type[torch.nn.LayerNorm]):
        super().__init__()
        self.key = torch.nn.Linear(8, 8)
        self.norm = norm(8)
        self.up = torch.nn.Linear(8, 32)
        self.down = torch.nn.Linear(32, 8)

    def forward(self, x, cache):
        self.key(x)
        keys = cache[self.key] if isinstance(cache, dict) else torch.cat(cache, dim=1)
        h = torch.softmax(x @ keys.transpose(1, 2), dim=-1) @ keys
        return self.down(torch.relu(self.up(self.norm(h))))


def _cache_hooks(model, kind):
    """The app's cache: a dict (concatenated per call) or a list (appended per call)."""
    holder = {} if kind == "dict" else []

    def save(module, args, output):
        if kind == "dict":
            holder[module] = output if module not in holder else torch.cat([holder[module], output], dim=1)
        else:
            holder.append(output)

    return holder, model.key.register_forward_hook(save)


class TestRerunStartsFromTheCallersCache:
    """A guard's re-run starts from the dicts and lists the call was handed as they were:
    keys a failed attempt added are gone, so the cache holds what one run adds."""

    FAILURES = {
        # fp16 overflow in ``up`` (its output ~1e6): a non-finite output, pinned and re-run.
        "overflow": (FP16, torch.nn.LayerNorm, lambda m: (m.up.weight.mul_(1e6), m.down.weight.div_(1e6)), r"pinned up"),
        # bf16 weights meet the fp32 input of the norm: a dtype error, pinned and re-run.
        "dtype-error": (Policy((Rule("*", storage="bf16"),)), _CastingNorm, lambda m: None, r"pinned norm"),
    }

    @pytest.mark.parametrize("kind", ["dict", "list"])
    @pytest.mark.parametrize("failure", sorted(FAILURES))
    def test_cache_grows_by_one_call(self, failure, kind, store):
        policy, norm, prepare, message = self.FAILURES[failure]
        torch.manual_seed(0)
        model = _HookCachedDecoder(norm).eval()
        with torch.no_grad():
            prepare(model)
        steps = [torch.randn(1, 3, 8), torch.randn(1, 1, 8), torch.randn(1, 1, 8)]

        def decode():
            holder, handle = _cache_hooks(model, kind)
            try:
                outs = [model(x, cache=holder) for x in steps]
            finally:
                handle.remove()
            return outs, holder

        with torch.no_grad():
            ref, ref_cache = decode()
            with mixprec.apply(model, policy) as applied:
                guard = mixprec.guard(applied, on_nonfinite="fallback", store=store)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    outs, cache = decode()
                guard.remove()
        said = [str(w.message) for w in caught]
        assert len(said) == 1 and re.search(message, said[0]), said
        assert guard.pins
        lengths = [v.shape[1] for v in (cache.values() if kind == "dict" else cache)]
        assert lengths == [v.shape[1] for v in (ref_cache.values() if kind == "dict" else ref_cache)]
        for out, expected in zip(outs, ref):
            assert out.shape == expected.shape and torch.isfinite(out).all()
            assert (out.float() - expected).abs().max() <= 0.05 * expected.abs().max()
