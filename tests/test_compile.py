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

from test_upcast import FP16_UPCAST, ExplicitAttention, _overflowing_llama

#: Breaks that come from the model's own layers wherever they are called from: Dynamo
#: does not trace RNN modules (in fp32 the same call makes it skip the whole frame, so
#: the break shows only once a cast runs before it).
MODEL_INHERENT = {"Attempted to wrap RNN, GRU, or LSTM"}


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
    ``recompiles``: frames compiled after the first call.
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
    torch._dynamo.reset()
    return {"breaks": reasons, "mixprec_breaks": sorted(reasons - set(baseline) - MODEL_INHERENT),
            "recompiles": counter.frame_count - first, "frames": first, "output": out}


@pytest.mark.parametrize("name", ["minilm", "tts", "diffusion"])
def test_presets_compile_without_mixprec_graph_breaks_or_recompiles(name, bf16_cpu):
    hw = hardware.probe()
    pipe = pipelines.get(name, size="test", seed=0)
    inputs = pipe.example_inputs(1, 0)
    baseline = {c: compile_report(fn, a, k, calls=1)["breaks"] for c, (fn, a, k) in _captured_calls(pipe, inputs).items()}
    for preset in ("fast", "balanced", "memory"):
        policy = mixprec.preset(preset, hardware=hw, hints=tuple(pipe.sensitive))
        applied = mixprec.apply(pipe, policy)
        assert any(p.storage != "fp32" for p in applied.plans)  # the probe says bf16 is fast: 16-bit weights
        calls = _captured_calls(pipe, inputs)
        assert set(calls) >= {c for c in pipe.components if c != "vae"}
        for component, (fn, args, kwargs) in calls.items():
            report = compile_report(fn, args, kwargs, baseline=baseline[component])
            where = f"{name}/{preset}/{component}"
            assert report["mixprec_breaks"] == [], where
            assert report["recompiles"] == 0, where
        applied.revert()


LLAMA_X = torch.ones(1, 6, 64)


def _diffusers_attention():
    from diffusers.models.attention_processor import Attention, AttnProcessor

    torch.manual_seed(0)
    attn = Attention(query_dim=64, heads=4, dim_head=16, processor=AttnProcessor())
    with torch.no_grad():
        attn.to_q.weight.fill_(4.0)
        attn.to_k.weight.fill_(4.0)
    return attn


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
        "diffusers-classic": lambda: (_diffusers_attention(), torch.ones(1, 6, 64), {}),
        "explicit-matmul": lambda: (_explicit(False), torch.ones(2, 5, 32), {}),
        "sdpa": lambda: (_explicit(True), torch.ones(2, 5, 32), {}),
    }[path]()
    args = () if x is None else (x,)
    with torch.no_grad():
        reference = model(*args, **kwargs)
    reference = getattr(reference, "last_hidden_state", reference)
    applied = mixprec.apply(model, FP16_UPCAST)
    report = compile_report(model, args, kwargs)
    applied.revert()
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
