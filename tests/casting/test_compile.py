"""Policies under torch.compile: no graph break caused by mixprec, no recompile after the first call.

Graphs are counted with Dynamo's own tools (its graph-break counters, and a counting
backend for frames and recompiles). A break counts against mixprec when the model has
no such break without mixprec. The counting backend runs the traced graphs as traced,
so the outputs also show that the traced casts and upcast scopes do what the eager ones do.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

import mixprec
from mixprec import hardware, pipelines
from mixprec.policy import Policy, Rule

from test_upcast import FP16_UPCAST, ExplicitAttention, _overflowing_llama, overflowing_diffusers_attention

#: Breaks (the start of their reasons) that come from the model's own code wherever it is
#: called from. Dynamo does not trace RNN modules (in fp32 the same call makes it skip the
#: whole frame, so the break shows only once a cast runs before it): torch 2.13's wording,
#: then torch 2.6's. diffusers' upsampler checks the torch version when its input is bf16
#: (``packaging.version.parse``, whose ``frozenset.issuperset`` torch 2.6's Dynamo cannot
#: trace): the UNet cast to bf16 without mixprec breaks there too.
MODEL_INHERENT = ("Attempted to wrap RNN, GRU, or LSTM", "TorchDynamo purposely graph breaks on RNN, GRU, LSTMs",
                  "call_method FrozensetVariable() issuperset")

#: transformers 5's attention masks call ``torch.compiler.is_exporting`` (torch >= 2.7) while
#: traced; an older Dynamo fails inside the model there, with or without mixprec. (With it
#: stubbed in, torch 2.6's Dynamo fails next in transformers' output-capturing wrapper:
#: ``NameError: name 'torch' is not defined`` in a resume function, also without mixprec.)
TRANSFORMERS_TRACEABLE = hasattr(torch.compiler, "is_exporting")
NO_IS_EXPORTING = (f"torch {torch.__version__} lacks torch.compiler.is_exporting (torch >= 2.7), which transformers' "
                   "attention masks call when traced: its models do not compile on this torch, with or without mixprec")


#: The reference pipelines at ``size="test"``, shallower: one of each repeated block (the
#: diffusion VAE with two levels instead of four, so one upsampler still runs; one text and one
#: Llama layer; two vocoder stages, an odd stride among them), and smaller latents and fewer
#: speech tokens. Tracing a component costs in proportion to its layers, and each traced call
#: runs 16-bit arithmetic that a CPU without native bf16 emulates; every module type, attention
#: kind and code path of the test size is still there. ``steps`` stays 2 and ``num_tokens`` 4:
#: a second denoising step and three decoded tokens are what shows a per-step recompile.
#: (``minilm`` is the trained model: one size.)
SHALLOW = {
    "minilm": {},
    "tts": {"t3_layers": 1, "s3_estimator_layers": 1, "voc_upsample": (8, 5), "num_tokens": 4},
    "diffusion": {"text_layers": 1, "vae_channels": (8, 16), "latent_size": 4},
}


def _from_transformers(fn) -> bool:
    return type(getattr(fn, "__self__", fn)).__module__.startswith("transformers.")


def _captured_calls(pipe, inputs) -> dict[str, tuple]:
    """The first call of each component's forward (and of a VAE's decode) in one pipeline run."""
    calls: dict[str, tuple] = {}
    handles = []
    for name, comp in pipe.components.items():
        handles.append(comp.register_forward_pre_hook(
            lambda m, a, k, name=name: calls.setdefault(name, (m, a, k)) and None, with_kwargs=True))
        if hasattr(comp, "decode"):
            original = comp.decode

            def decode(*a, _name=name, _comp=comp, _original=original, **k):
                calls.setdefault(f"{_name}.decode", (_comp.decode, a, k))
                return _original(*a, **k)

            comp.decode = decode
    with torch.no_grad():
        pipe.run(inputs)
    for handle in handles:
        handle.remove()
    for comp in pipe.components.values():
        comp.__dict__.pop("decode", None)
    return calls


def compile_report(fn, args, kwargs, calls: int = 10, baseline: set[str] = frozenset()) -> dict:
    """Compile ``fn`` (Dynamo, counting backend), call it ``calls`` times, and say what broke.

    ``mixprec_breaks``: graph-break reasons that the model does not have on its own
    (``baseline``: its reasons without mixprec) and that are not inherent to its layers;
    ``recompiles``: frames compiled after the first call; ``skipped``: reasons Dynamo gave
    up on a frame before its first graph (the frame then runs eagerly: a break that the
    graph-break counter does not count when it is the compiled function's own frame).
    """
    torch._dynamo.reset()
    counters.clear()
    counter = CompileCounter()
    compiled = torch.compile(fn, backend=counter)
    with torch.no_grad():
        out = compiled(*args, **kwargs)
        first = counter.frame_count
        for _ in range(calls - 1):
            compiled(*args, **kwargs)
    reasons = {str(reason).splitlines()[0] for reason in counters["graph_break"]}
    skipped = {str(reason).splitlines()[0] for reason in counters["unimplemented"]}
    torch._dynamo.reset()
    own = {r for r in reasons if r in set(baseline) or r.startswith(MODEL_INHERENT)}
    return {"breaks": reasons, "mixprec_breaks": sorted(reasons - own), "skipped": skipped,
            "recompiles": counter.frame_count - first, "frames": first, "output": out}


@pytest.mark.parametrize("name", ["minilm", "tts", "diffusion"])
def test_presets_compile_without_mixprec_graph_breaks_or_recompiles(name, bf16_cpu):
    hw = hardware.probe()
    pipe = pipelines.get(name, size="test", seed=0, **SHALLOW[name])
    inputs = pipe.example_inputs(1, 0)
    # In fp32, without mixprec, these components trace without a break (the voice
    # encoder's LSTM aside, MODEL_INHERENT); so every other break would be mixprec's.
    compiled = set()
    for preset in ("fast", "balanced", "memory"):
        policy = mixprec.preset(preset, hardware=hw, hints=tuple(pipe.sensitive))
        applied = mixprec.apply(pipe, policy)
        assert any(p.storage != "fp32" for p in applied.plans)  # the probe says bf16 is fast: 16-bit weights
        calls = _captured_calls(pipe, inputs)
        assert set(calls) >= {c for c in pipe.components if c != "vae"}
        for component, (fn, args, kwargs) in calls.items():
            if not TRANSFORMERS_TRACEABLE and _from_transformers(fn):
                continue  # the model's own failure on this torch (NO_IS_EXPORTING)
            compiled.add(component)
            # Three calls: the second shows any state the first left different, the third any
            # that keeps changing (each call's own recompile, up to the limit).
            report = compile_report(fn, args, kwargs, calls=3)
            where = f"{name}/{preset}/{component}"
            assert report["mixprec_breaks"] == [], where
            assert report["recompiles"] == 0, where
        applied.revert()
    if not compiled:
        pytest.skip(NO_IS_EXPORTING)


LLAMA_X = torch.ones(1, 6, 64)


def _explicit(sdpa: bool):
    torch.manual_seed(0)
    model = ExplicitAttention(sdpa)
    with torch.no_grad():
        model.qkv.weight[:64].fill_(8.0)
    return model


@pytest.mark.parametrize("path", ["transformers-eager", "diffusers-classic", "explicit-matmul", "sdpa"])
def test_upcast_attention_compiles_on_every_path_and_stays_finite(path):
    model, x, kwargs = {
        "transformers-eager": lambda: (_overflowing_llama(), None, {"inputs_embeds": LLAMA_X}),
        "diffusers-classic": lambda: (overflowing_diffusers_attention(), torch.ones(1, 6, 64), {}),
        "explicit-matmul": lambda: (_explicit(False), torch.ones(2, 5, 32), {}),
        "sdpa": lambda: (_explicit(True), torch.ones(2, 5, 32), {}),
    }[path]()
    args = () if x is None else (x,)
    with torch.no_grad():
        reference = model(*args, **kwargs)
    reference = getattr(reference, "last_hidden_state", reference)
    # Older Dynamo (torch 2.6) cannot trace parts of transformers' Llama on its own (super()
    # calls on a dict subclass, iterating a config view, a function's __code__): there the
    # model alone is several graphs, and what is checked is that mixprec adds no break to them.
    alone = None if TRANSFORMERS_TRACEABLE or path != "transformers-eager" else compile_report(model, args, kwargs)
    own = alone["breaks"] | alone["skipped"] if alone else set()
    applied = mixprec.apply(model, FP16_UPCAST)
    report = compile_report(model, args, kwargs, baseline=own)
    applied.revert()
    if own:
        assert report["mixprec_breaks"] == [] and report["recompiles"] == 0
    else:
        assert report["breaks"] == set() and report["recompiles"] == 0 and report["frames"] == 1
    out = getattr(report["output"], "last_hidden_state", report["output"])
    assert torch.isfinite(out).all()  # the traced graph upcasts the scores as the eager mode does
    assert torch.allclose(out.float(), reference, atol=2e-2, rtol=1e-2)


def test_fp32_compute_compiles_without_touching_weights_and_reverts_bit_exact():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 16)
            self.conv = torch.nn.Conv1d(16, 16, 3, padding=1)
            self.up = torch.nn.ConvTranspose1d(16, 16, 4, stride=2, padding=1)
            self.norm = torch.nn.GroupNorm(4, 16)
            self.bn = torch.nn.BatchNorm1d(16)
            self.lin = torch.nn.Linear(16, 16)
            self.ln = torch.nn.LayerNorm(16)
            self.rms = torch.nn.RMSNorm(16)
            self.scale = torch.nn.Parameter(torch.full((16,), 0.5))  # a module's own parameter: the generic path

        def forward(self, ids):
            x = self.emb(ids).transpose(1, 2)
            x = self.bn(self.norm(self.up(self.conv(x)))).transpose(1, 2)
            return self.rms(self.ln(self.lin(x))) * self.scale

    torch.manual_seed(0)
    net = Net().eval()
    ids = torch.randint(0, 50, (2, 8))
    before = {k: (v.dtype, v.clone()) for k, v in net.state_dict().items()}
    with torch.no_grad():
        reference = net(ids)
    applied = mixprec.apply(net, Policy((Rule("*", storage="bf16", compute="fp32"),)))
    stored = {k: v.data_ptr() for k, v in net.state_dict().items()}
    report = compile_report(net, (ids,), {})
    assert report["breaks"] == set() and report["recompiles"] == 0 and report["frames"] == 1
    out = report["output"]
    assert out.dtype == torch.float32 and torch.allclose(out, reference, atol=5e-2, rtol=5e-2)
    # The weights were read, never replaced: same storage, still bf16.
    assert {k: v.data_ptr() for k, v in net.state_dict().items()} == stored
    assert net.lin.weight.dtype == torch.bfloat16
    applied.revert()
    for key, (dtype, value) in before.items():
        assert net.state_dict()[key].dtype == dtype and torch.equal(net.state_dict()[key], value), key


def test_policy_compile_round_trips_and_bad_settings_are_refused():
    policy = Policy((Rule("*", storage="bf16"),), compile=mixprec.CompileSettings(mode="max-autotune", dynamic=False))
    for text in (policy.to_toml(), policy.to_json()):
        loaded = Policy.from_toml(text) if text.lstrip().startswith(("version", "name")) else Policy.from_json(text)
        assert loaded == policy
    assert Policy.from_toml('compile = true\n[[rules]]\nmatch = "*"\nstorage = "bf16"\n').compile == mixprec.CompileSettings()
    for bad, message in ((b'compile = {mode = "fastest"}', r"compile.*unknown mode 'fastest'.*valid: default"),
                         (b'compile = {dynamic = "yes"}', r"compile dynamic: expected true or false"),
                         (b'compile = {mod = "default"}', r"unknown key 'mod'.*did you mean 'mode'"),
                         (b'compile = 3', r"key 'compile': expected a table")):
        with pytest.raises(mixprec.PolicyError, match=message):
            Policy.from_toml(bad.decode())


def test_apply_compiles_each_component_and_revert_drops_it_bit_exact():
    from torch._dynamo import register_backend

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 4)).eval()
    x = torch.randn(3, 8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    counter = CompileCounter()
    name = f"mixprec_test_counter_{id(counter)}"
    register_backend(counter, name=name)  # a named backend, as a policy file would give it
    policy = Policy((Rule("*", storage="bf16", compute="fp32"),), compile=mixprec.CompileSettings(backend=name))
    applied = mixprec.apply(model, policy)
    with torch.no_grad():
        for _ in range(3):
            out = model(x)
    assert counter.frame_count == 1  # one graph: the casts, the fp32 compute and the model, no recompile
    assert out.dtype == torch.float32 and model[0].weight.dtype == torch.bfloat16
    applied.revert()
    assert model._compiled_call_impl is None
    assert all(torch.equal(before[k], v) and v.dtype == before[k].dtype for k, v in model.state_dict().items())


def test_inductor_without_a_compiler_is_a_clear_error_before_anything_is_cast(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setenv("PATH", "/nonexistent")
    model = torch.nn.Linear(4, 4)
    with pytest.raises(mixprec.ApplyError, match=r"needs a C\+\+ compiler.*no-such-compiler.*'aot_eager' or 'eager'"):
        mixprec.apply(model, Policy((Rule("*", storage="bf16"),), compile=mixprec.CompileSettings()))
    assert model.weight.dtype == torch.float32 and model._compiled_call_impl is None


def test_guard_checks_a_compiled_component_and_falls_back_on_an_eager_rerun(tmp_path):
    from guard_models import OverflowingMLP, assert_fallback_output
    from mixprec.diagnose.fallbacks import FallbackStore

    model = OverflowingMLP()
    x = torch.ones(2, 4)
    with torch.no_grad():
        expected = model(x)
    policy = Policy((Rule("*", storage="fp16"),), compile=mixprec.CompileSettings(backend="eager"))
    applied = mixprec.apply({"m": model}, policy)
    guard = mixprec.guard(applied, on_nonfinite="fallback", store=FallbackStore(tmp_path / "f.json"))
    counters.clear()
    with pytest.warns(UserWarning, match="pinned"), torch.no_grad():
        out = model(x)
    assert counters["graph_break"] == {}  # the guard stepped aside inside the compiled call
    assert "m.up" in guard.pins and guard.reports[0].module == "m.up"
    # The ladder steps fp16 -> bf16 where the probe measured bf16 fast, else -> fp32.
    assert guard.pins["m.up"].dtype == ("bf16" if hardware.probe().dtypes["bf16"].klass == "fast" else "fp32")
    assert_fallback_output(out, expected, guard)
    assert model._compiled_call_impl is not None  # re-applied with the pin, compiled again
    with torch.no_grad():
        assert torch.isfinite(model(x)).all()
    applied.revert()


def test_tune_tries_compiling_as_its_last_local_move_and_keeps_it_only_if_faster():
    from mixprec.tuning.evaluators import InProcessEvaluator
    from mixprec.tuning.tuner import tune

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()) for _ in range(4)]).eval()

    def make_inputs(seed):
        return torch.randn(8, 64, generator=torch.Generator().manual_seed(seed))

    evaluator = InProcessEvaluator(model, make_inputs, model, seeds=(0, 1), repeat=3, name="mlp")
    result = tune("mlp", "sqnr>=30", evaluator=evaluator, dtypes=(), budget=30, final_rounds=0, try_compile=True)
    tried = [c for c in result.path if c.step == "local: toggle compile"]
    assert tried and tried[0].policy.compile is not None and tried[0].met
    round_trip = Policy.from_toml(tried[0].policy.to_toml())
    assert round_trip.compile == mixprec.CompileSettings()
    # Kept only where it measured faster than every uncompiled candidate that meets the bound.
    uncompiled = min(c.evaluation.latency_s for c in result.path if c.met and c.policy.compile is None)
    if result.policy.compile is not None:
        assert result.chosen.evaluation.latency_s < uncompiled
    else:
        assert all(c.evaluation.latency_s >= uncompiled * 0.97 for c in tried) or result.chosen.evaluation.latency_s <= uncompiled
    assert model._compiled_call_impl is None  # every evaluation reverted its policy, compiled or not


#: A factory file for ``bench --pipeline f.py:build``: minilm's architecture (a transformers
#: ``BertModel``, mean-pooled over its attention mask), one layer of width 32 with random
#: weights. Each bench run starts a worker that builds it and one that compiles it with
#: inductor; minilm's six trained layers cost each worker seconds to load and the compile
#: twice the generated code, for the same path.
_TINY_ENCODER = """
import torch
import transformers
from mixprec.pipelines import EmbeddingOutput, Pipeline


class TinyEncoder(Pipeline):
    name = "tiny-encoder"
    output_kind = "embedding"

    def __init__(self):
        config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=16)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            encoder = transformers.BertModel(config).eval()
        super().__init__({"encoder": encoder})

    def _example_inputs(self, batch, seed):
        ids = torch.randint(1, 64, (batch, 8), generator=torch.Generator().manual_seed(seed))
        return ids, torch.ones_like(ids)

    def _run(self, inputs):
        ids, mask = inputs
        hidden = self.components["encoder"](input_ids=ids, attention_mask=mask).last_hidden_state.float()
        weights = mask.unsqueeze(-1).float()
        return EmbeddingOutput(output=torch.nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), dim=-1))


def build(size="default", seed=0):
    return TinyEncoder()
"""


def test_bench_measures_compiled_configurations_with_their_compile_time(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from mixprec.bench.store import Store
    from mixprec.bench.table import render_table_rows
    from mixprec.cli import app

    db = tmp_path / "b.sqlite"
    factory = tmp_path / "encoder.py"
    factory.write_text(_TINY_ENCODER)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # the workers start with an empty one
    args = ["bench", "--pipeline", f"{factory}:build", "--size", "test", "--configs", "fp32,memory+compile",
            "--repeat", "1", "--warmup", "0", "--db", str(db)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    by_name = {c["name"]: c for c in Store(db).load_run(1)["configs"]}
    compiled = by_name["memory+compile"]
    if not TRANSFORMERS_TRACEABLE:
        # The model cannot compile on this torch (NO_IS_EXPORTING): the run says why, and which torch can.
        assert compiled["status"] == "failed" and by_name["fp32"]["status"] == "ok"
        assert "CompileUnsupported" in compiled["error"] and "torch.compiler.is_exporting" in compiled["error"]
        assert "torch 2.7 and later have it" in compiled["error"]
        pytest.skip(NO_IS_EXPORTING)
    assert compiled["status"] == "ok" and compiled["metrics"]["compile_s"] > 0
    assert "compile_s" not in by_name["fp32"]["metrics"]
    assert compiled["policy"]["compile"] == {"mode": "default", "backend": "inductor"}
    assert compiled["metrics"]["sqnr_db"] > 30  # bf16 weights, fp32 compute, compiled: same numbers as eager
    assert compiled["metrics"]["weight_bytes"] < by_name["fp32"]["metrics"]["weight_bytes"] * 0.6
    assert compiled["metrics"]["compile_cached"] == 0  # every graph generated in the first process
    # A later process loads what the first compiled from torch's on-disk cache, and the table says so.
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    run = Store(db).load_run(2)
    later = {c["name"]: c for c in run["configs"]}["memory+compile"]
    assert later["metrics"]["compile_cached"] == 1
    assert {r["config"]: r for r in render_table_rows(run)}["memory+compile"]["compile_cached"] == "100.0%"
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setenv("PATH", "/nonexistent")
    refused = CliRunner().invoke(app, ["bench", "--pipeline", f"{factory}:build", "--size", "test", "--configs", "fp32",
                                       "--compile", "--db", str(db)])
    assert refused.exit_code == 2 and "needs a C++ compiler" in refused.output


def test_a_preset_takes_a_compile_override():
    policy = mixprec.preset("memory", overrides={"compile": {"mode": "reduce-overhead", "dynamic": False}})
    assert policy.compile == mixprec.CompileSettings(mode="reduce-overhead", dynamic=False)
    assert mixprec.preset("memory", overrides={"compile": True}).compile == mixprec.CompileSettings()
    with pytest.raises(mixprec.PolicyError, match=r"overrides compile: compile mode: unknown mode 'x'"):
        mixprec.preset("memory", overrides={"compile": {"mode": "x"}})


def test_the_compiled_graph_takes_the_16bit_weights_as_inputs_and_holds_no_fp32_copy():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)).eval()
    applied = mixprec.apply(model, Policy((Rule("*", storage="bf16", compute="fp32"),)))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        compiled(torch.randn(4, 32))
    (gm, inputs), = graphs
    shapes = {tuple(p.shape) for p in model.parameters()}
    weight_inputs = [t for t in inputs if isinstance(t, torch.Tensor) and tuple(t.shape) in shapes]
    assert weight_inputs and all(t.dtype == torch.bfloat16 for t in weight_inputs)  # read per call, not baked in
    held = [t for t in [*gm.parameters(), *gm.buffers()] if t.dtype == torch.float32 and tuple(t.shape) in shapes]
    assert held == [] and not any(n.op == "get_attr" for n in gm.graph.nodes)
    applied.revert()


def test_a_compiled_call_that_fails_on_a_torch_function_this_torch_lacks_says_which_and_where_it_is():
    from torch._dynamo.exc import InternalTorchDynamoError

    from mixprec.casting.compile import CompileUnsupported, missing_torch_feature

    missing = "module 'torch.compiler' has no attribute 'is_exporting'"
    own_error = []

    @torch._dynamo.disable
    def masks(x):  # what torch 2.6's Dynamo raises where transformers' masks call is_exporting
        if own_error:
            raise ValueError("the model's own error")
        try:
            raise AttributeError(missing)
        except AttributeError as exc:
            raise InternalTorchDynamoError(f"AttributeError: {exc}") from exc

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return masks(self.lin(x))

    model = Net()
    applied = mixprec.apply(model, Policy((Rule("*", storage="bf16"),), compile=mixprec.CompileSettings(backend="eager")))
    with pytest.raises(CompileUnsupported) as raised, torch.no_grad():
        model(torch.ones(2, 4))
    message = str(raised.value)
    assert "calls torch.compiler.is_exporting" in message and f"torch {torch.__version__} does not have" in message
    assert "torch 2.7 and later have it" in message and "needs torch 2.7 or later" in message
    assert "without compile" in message and isinstance(raised.value.__cause__, InternalTorchDynamoError)
    own_error.append(True)
    with pytest.raises(ValueError, match="the model's own error"), torch.no_grad():
        model(torch.ones(2, 4))  # any other error passes unchanged
    applied.revert()
    assert missing_torch_feature(AttributeError(missing)) is None  # raised by the model itself, compiled or not
    unknown = missing_torch_feature(InternalTorchDynamoError("AttributeError: module 'torch.fft' has no attribute 'newer'"))
    assert "calls torch.fft.newer" in unknown and "a newer torch may have it" in unknown
