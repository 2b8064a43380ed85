"""Every tensor mode torch has, around ``apply`` and ``revert``: grad modes, autocast, function
and dispatch modes, forward AD, ``torch.func`` transforms and tracers. Each works (nothing of
the model becomes or stops being an inference tensor) or is refused up front, nothing changed."""

from __future__ import annotations

import contextlib
import sys

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import mixprec
from kinds_torch_models import POLICIES, X, Holder, changed, state


def _refused_where_called(model, pattern: str):
    """A function that applies a bf16 policy to ``model`` where it is called (inside a transform,
    a trace) and expects the refusal ``pattern``; and the list of the errors it saw."""
    errors: list[Exception] = []

    def attempt() -> None:
        with pytest.raises(mixprec.ApplyError, match=pattern) as err:
            mixprec.apply(model, POLICIES["bf16"]())
        errors.append(err.value)

    return attempt, errors

class _Watching(TorchFunctionMode):
    """A user's function mode that only passes calls on."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Logging(TorchDispatchMode):
    """A user's dispatch mode that only watches."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _default_float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


#: Modes apply works under.
MODES_THAT_WORK = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad, "enable_grad": torch.enable_grad,
                   "autocast": lambda: torch.autocast("cpu", torch.bfloat16), "a user's dispatch mode": _Logging,
                   "default device meta": lambda: torch.device("meta"), "forward-AD level": torch.autograd.forward_ad.dual_level,
                   "a user's function mode": _Watching, "anomaly detection": torch.autograd.detect_anomaly,
                   "saved tensor hooks": lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t),
                   "flop counter": lambda: FlopCounterMode(display=False), "default dtype float64": _default_float64}



def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def _functional_mode():
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    return FunctionalTensorMode()


class TestModes:
    @pytest.mark.parametrize("policy", sorted(POLICIES))
    @pytest.mark.parametrize("mode", sorted(MODES_THAT_WORK))
    def test_apply_inside_a_mode_works_and_the_model_stays_trainable(self, mode, policy):
        model = Holder(lambda m: None)
        before, reference = state(model), model(X)
        with MODES_THAT_WORK[mode]():
            applied = mixprec.apply(model, POLICIES[policy]())
        assert not any(t.is_inference() for t in model.parameters())  # the app can still train or take gradients
        with torch.no_grad():
            assert torch.isfinite(model(X).float()).all()
        with MODES_THAT_WORK[mode]():
            applied.revert()
        assert changed(before, model) == []
        assert torch.equal(model(X), reference)
        model(X).sum().backward()

    @pytest.mark.parametrize("policy", sorted(POLICIES))
    def test_apply_run_and_revert_all_under_inference_mode(self, policy):
        model = Holder(lambda m: None)
        before = state(model)
        with torch.inference_mode(), mixprec.apply(model, POLICIES[policy]()):
            model(X)
        assert changed(before, model) == []

    @pytest.mark.parametrize("transform", ["vmap", "grad", "functionalize", "jvp"])
    def test_apply_inside_a_torch_func_transform_is_refused(self, transform):
        model = Holder(lambda m: None)
        before = state(model)
        attempt, errors = _refused_where_called(model, r"inside a torch\.func transform .*nothing was changed")

        def body(x):
            attempt()
            return x.sum()

        x = torch.randn(8)
        if transform == "jvp":
            torch.func.jvp(body, (x,), (torch.ones(8),))
        else:
            getattr(torch.func, transform)(body)(x if transform != "vmap" else x.reshape(2, 4))
        assert errors and changed(before, model) == []

    @pytest.mark.parametrize("mode,words", [(_fake_mode, "fake"), (_functional_mode, "functional")])
    def test_apply_under_torchs_own_tensor_modes_is_refused(self, mode, words):
        model = Holder(lambda m: None)
        before = state(model)
        with mode(), pytest.raises(mixprec.ApplyError, match=rf"under torch's {words} dispatch mode.*nothing was changed"):
            mixprec.apply(model, POLICIES["bf16"]())
        assert changed(before, model) == []

    @pytest.mark.parametrize("tracer,words", [
        (lambda f: __import__("torch.fx.experimental.proxy_tensor").fx.experimental.proxy_tensor.make_fx(f)(X), "proxy dispatch mode"),
        (lambda f: torch.jit.trace(f, (X,), check_trace=False), r"inside torch\.jit\.trace"),
        (lambda f: torch.export.export(_Calls(f), (X,)), "fake dispatch mode")], ids=["make_fx", "jit.trace", "export"])
    def test_apply_while_tracing_is_refused(self, tracer, words):
        model = Holder(lambda m: None)
        before = state(model)
        attempt, errors = _refused_where_called(model, rf"{words}.*nothing was changed")

        def traced(x):
            attempt()
            return x * 2

        tracer(traced)
        assert errors and changed(before, model) == []

    def test_apply_inside_a_compiled_function_works(self):
        model = Holder(lambda m: None)
        before, kept = state(model), {}

        def body(x):
            kept["applied"] = mixprec.apply(model, POLICIES["bf16"]())
            return x * 2

        torch.compile(body, backend="eager")(X)
        assert model.lin.weight.dtype == torch.bfloat16
        kept["applied"].revert()
        assert changed(before, model) == []


class _Calls(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


#: The entry points that share one check of the context they are called in: each refused, nothing changed.
def _entries(model, applied):
    return {
        "apply": lambda: mixprec.apply(model, POLICIES["bf16"]()),
        "revert": applied.revert,
        "reapply": lambda: applied.reapply(POLICIES["bf16"]()),
        "profile": lambda: mixprec.profile(model, (X,), POLICIES["bf16"]()),
        "guard": lambda: mixprec.guard(applied),
        "calibrate": lambda: mixprec.calibrate(model, "fast", (X,), cache=False),
        # a preset's name: refused before it is resolved (the hardware probe cannot run there)
        "apply by name": lambda: mixprec.apply(model, "fast"),
        "apply calibrated": lambda: mixprec.apply(model, "fast", calibrate=(X,), cache=False),
        "profile by name": lambda: mixprec.profile(model, (X,), "fast"),
    }


@pytest.mark.parametrize("entry", ["apply", "revert", "reapply", "profile", "guard", "calibrate", "apply by name",
                                   "apply calibrated", "profile by name"])
@pytest.mark.parametrize("where", ["vmap", "fake", "trace"])
def test_every_entry_point_is_refused_in_an_unsupported_context_before_any_change(entry, where, monkeypatch):
    def no_probe(*args, **kwargs):
        raise AssertionError("the hardware probe ran in an unsupported context")

    monkeypatch.setattr(sys.modules["mixprec.device.hardware"], "probe", no_probe)
    monkeypatch.setattr(sys.modules["mixprec.calibration.calibrate"], "probe", no_probe)
    model, other = Holder(lambda m: None), Holder(lambda m: None)
    applied = mixprec.apply(other, POLICIES["bf16"]())  # revert, reapply and guard act on an applied model
    before, applied_before = state(model), state(other)
    call = _entries(model, applied)[entry]
    errors = []

    def attempt():
        with pytest.raises(mixprec.ApplyError, match=r" was called (inside a torch\.func transform|under torch's fake "
                                                     r"|inside torch\.jit\.trace).*nothing was changed") as err:
            call()
        errors.append(err.value)

    if where == "vmap":
        torch.func.vmap(lambda x: (attempt(), x.sum())[1])(torch.randn(2, 4))
    elif where == "trace":
        torch.jit.trace(lambda x: (attempt(), x * 2)[1], (torch.randn(2, 4),), check_trace=False)
    else:
        with _fake_mode():
            attempt()
    called = {"revert": "Applied.revert", "reapply": "Applied.reapply"}.get(entry, f"mixprec.{entry.split()[0]}")
    assert len(errors) == 1 and str(errors[0]).startswith(f"{called} was called"), errors
    assert changed(before, model) == [] and changed(applied_before, other) == [] and applied.active
    applied.revert()


@pytest.mark.parametrize("kind", ["meta", "mkldnn"])
@pytest.mark.parametrize("entry", ["profile", "calibrate"])
def test_profile_and_calibrate_refuse_tensors_they_cannot_compute_from_in_mixprecs_words(kind, entry):
    model = nn.Sequential(nn.Linear(4, 4))
    if kind == "meta":
        model = model.to("meta")
    else:
        model.register_buffer("table", torch.randn(4, 4).to_mkldnn())
    call = {"profile": lambda: mixprec.profile(model, (torch.randn(2, 4),), "fast"),
            "calibrate": lambda: mixprec.calibrate(model, "fast", (torch.randn(2, 4),), cache=False)}[entry]
    words = "on the meta device" if kind == "meta" else "of the mkldnn layout"
    with pytest.raises(mixprec.ApplyError, match=rf"{words}.*nothing was changed"):
        call()
