"""Where dtypes meet inside a component: ops that refuse their inputs' dtypes run in the wider one.

The models below are written the way real model code is, each with a different place
where a 16-bit activation meets a tensor the code made itself (or an op without a
16-bit kernel): deep in a block's ``forward``, in a library function the block calls,
in attention with a key made in fp32. None of them is named anywhere in mixprec.
"""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mixprec
from mixprec.casting.meet import WidenMode, float_dtypes, is_dtype_error, widest
from mixprec.policy import Policy, Rule

BF16 = Policy((Rule("*", storage="bf16"),), name="bf16")
FP16 = Policy((Rule("*", storage="fp16"),), name="fp16")


class AlignedBlock(nn.Module):
    """Mixes its activation with an alignment matrix kept as a plain attribute (fp32)."""

    def __init__(self, frames: int = 16):
        super().__init__()
        self.proj = nn.Conv1d(8, 8, 3, padding=1)
        self.alignment = torch.softmax(torch.randn(frames, frames), dim=-1)  # not a buffer: never cast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bct,ts->bcs", torch.relu(self.proj(x)), self.alignment)


class WhitenedBlock(nn.Module):
    """Calls an op with no 16-bit kernel on CPU (a matrix inverse) on its own activation."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x.transpose(1, 2))  # (b, t, 8)
        cov = h.transpose(1, 2) @ h / h.shape[1] + torch.eye(8, dtype=h.dtype)
        return (h @ torch.linalg.inv(cov)).transpose(1, 2)


class ResampledBlock(nn.Module):
    """Resamples its output with torchaudio, then filters it with an FIR made in fp32 at
    construction (a plain attribute), through torchaudio's ``convolve``, inside ``forward``."""

    def __init__(self):
        super().__init__()
        pytest.importorskip("torchaudio")  # an optional package: the cases built on it skip without it
        self.out = nn.Conv1d(8, 1, 3, padding=1)
        self.fir = torch.hann_window(7, periodic=False) / 3.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torchaudio

        wav = torchaudio.functional.resample(torch.tanh(self.out(x)).squeeze(1), 16000, 24000)
        return torchaudio.functional.convolve(wav, self.fir.expand(wav.shape[0], -1), mode="same")


class PromptAttention(nn.Module):
    """Attends to a fixed prompt key made in fp32 at construction (a plain attribute)."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.prompt = torch.randn(1, 4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x.transpose(1, 2))
        key = self.prompt.expand(q.shape[0], -1, -1)
        return F.scaled_dot_product_attention(q, key, key).transpose(1, 2)


class Stack(nn.Module):
    def __init__(self, block: nn.Module):
        super().__init__()
        self.pre = nn.Conv1d(4, 8, 3, padding=1)
        self.layers = nn.ModuleList([nn.Sequential(nn.Conv1d(8, 8, 3, padding=1), nn.SiLU()), block])
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        h = self.pre(x)
        for layer in self.layers:
            h = layer(h)
        return h


BLOCKS = {
    "einsum-with-plain-attribute": (AlignedBlock, r"torch\.einsum \(bfloat16 and float32"),
    "no-16-bit-kernel": (WhitenedBlock, r"torch\.linalg\.inv \(bfloat16, called from .*test_meet\.py:\d+ \(forward\)"),
    "library-resample": (ResampledBlock, r"torch\.conv1d \(bfloat16 and float32, called from .*torchaudio"),
    "attention-key-made-in-fp32": (PromptAttention, r"scaled_dot_product_attention \(bfloat16 and float32"),
}


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _sqnr(test, ref):
    return float(10 * torch.log10(ref.pow(2).sum() / (test.float() - ref).pow(2).sum()))


@pytest.mark.parametrize("case", sorted(BLOCKS))
def test_an_op_deep_in_a_component_that_refuses_mixed_dtypes_runs_in_the_wider_one(case):
    block, names = BLOCKS[case]
    torch.manual_seed(0)
    model = Stack(block()).eval()
    x = torch.randn(2, 4, 16)
    with torch.no_grad():
        ref = model(x)
    before = _state(model)
    applied = mixprec.apply({"net": model}, BF16)
    try:
        assert model.pre.weight.dtype == torch.bfloat16
        calls = model.calls
        with pytest.warns(UserWarning, match=rf"(?s)in component 'net' \(forward\).*{names}.*wider dtype \(float32\)"):
            with torch.no_grad():
                out = model(x)
        assert model.calls == calls + 2  # the failed call, then the one run again
        assert out.dtype == torch.float32  # the component hands back its caller's dtype
        assert _sqnr(out, ref) > 25  # the rest still computes in bf16
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once: later calls widen without failing first
            with torch.no_grad():
                again = model(x)
        assert model.calls == calls + 3
        assert torch.equal(again, out)
    finally:
        applied.revert()
    after = model.state_dict()
    assert all(torch.equal(after[k], v) and after[k].dtype == v.dtype for k, v in before.items())
    with torch.no_grad():
        assert torch.equal(model(x), ref)


def test_only_the_ops_that_refuse_are_widened():
    """Ops that take mixed dtypes (type promotion) or one dtype run as they are."""
    seen = []
    a16, b32 = torch.randn(4, 4, dtype=torch.bfloat16), torch.randn(4, 4)
    with WidenMode(seen):
        assert (a16 + b32).dtype == torch.float32  # promotion: untouched
        assert torch.relu(a16).dtype == torch.bfloat16
        assert (a16 @ a16).dtype == torch.bfloat16
        assert (a16 @ b32).dtype == torch.float32  # refused, run in fp32
        assert torch.linalg.inv(torch.eye(3, dtype=torch.float16) * 2).dtype == torch.float32
    assert [op for op, *_ in seen] == ["Tensor.matmul", "torch.linalg.inv"]
    assert seen[0][1:3] == (("bfloat16", "float32"), "float32")


def test_in_place_ops_and_other_errors_are_never_widened():
    a16, b32 = torch.randn(4, 4, dtype=torch.bfloat16), torch.randn(4, 4)
    with WidenMode() as mode:
        with pytest.raises(RuntimeError):
            torch.zeros(3).index_add_(0, torch.tensor([0]), torch.ones(1, 3, dtype=torch.bfloat16))
        with pytest.raises(RuntimeError, match="size mismatch|shapes cannot be multiplied"):
            a16 @ b32[:3]  # a shape error stays the model's own
    assert mode.seen == []
    assert widest({torch.bfloat16, torch.float16}) == torch.float32
    assert widest({torch.bfloat16, torch.float64}) == torch.float64
    assert float_dtypes(([a16], {"k": b32}, 3)) == {torch.bfloat16, torch.float32}


class Broken(nn.Module):
    """Fails in fp32 too: a shape error of the model's own."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.table = torch.randn(5, 5)

    def forward(self, x):
        return self.proj(x) @ self.table


def test_an_error_widening_cannot_fix_is_the_models_own_and_raised_unchanged():
    model = Broken().eval()
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError) as fp32_error, torch.no_grad():
        model(x)
    applied = mixprec.apply({"m": model}, BF16)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(RuntimeError) as error, torch.no_grad():
                model(x)
        # Past the dtypes, the model's own error, as its fp32 run raises it; never a precision problem.
        assert not is_dtype_error(fp32_error.value)
        assert str(error.value) == str(fp32_error.value)
    finally:
        applied.revert()


def test_a_guard_takes_dtype_errors_itself_and_apply_widens_again_once_it_is_removed(tmp_path):
    torch.manual_seed(0)
    model = Stack(AlignedBlock()).eval()
    x = torch.randn(2, 4, 16)
    applied = mixprec.apply({"net": model}, BF16)
    try:
        guard = mixprec.guard(applied, on_nonfinite="raise", remember=False)
        with pytest.raises(mixprec.PrecisionDtypeError, match=r"einsum"), torch.no_grad():
            model(x)
        guard.remove()
        with pytest.warns(UserWarning, match="wider dtype"), torch.no_grad():
            assert model(x).dtype == torch.float32
    finally:
        applied.revert()


def test_two_threads_meeting_the_same_failure_both_get_right_results():
    torch.manual_seed(0)
    model = Stack(AlignedBlock()).eval()
    xs = [torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    with torch.no_grad():
        refs = [model(x) for x in xs]
    applied = mixprec.apply({"net": model}, BF16)
    results: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def run(i):
        try:
            start.wait()
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                for _ in range(5):
                    results[i] = model(xs[i])
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        applied.revert()
    assert not errors
    assert all(_sqnr(results[i], refs[i]) > 25 for i in range(2))


@pytest.mark.parametrize("policy", [BF16, FP16], ids=lambda p: p.name)
def test_component_methods_meet_dtypes_the_same_way(policy):
    """A component used through another method (``decode``) widens in that method only."""

    class Codec(Stack):
        def decode(self, x):
            h = self.forward(x)
            window = torch.hann_window(16)
            return torch.einsum("bct,t->bc", h, window)  # app code: a window made here

    torch.manual_seed(0)
    model = Codec(nn.Conv1d(8, 8, 1)).eval()
    x = torch.randn(2, 4, 16)
    with torch.no_grad():
        ref = model.decode(x)
    applied = mixprec.apply({"codec": model}, policy)
    try:
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            out = model.decode(x)
        assert out.dtype == torch.float32 and _sqnr(out, ref) > 20
        # The method body is app code: the forward it calls hands back fp32 already, so the
        # window meets fp32 and nothing had to be widened at all.
        assert not [w for w in caught if "wider dtype" in str(w.message)]
    finally:
        applied.revert()


def test_an_applied_model_with_a_widened_method_can_be_deep_copied():
    import copy

    torch.manual_seed(0)
    model = Stack(AlignedBlock()).eval()
    x = torch.randn(2, 4, 16)
    applied = mixprec.apply({"net": model}, BF16)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            out = model(x)
        twin = copy.deepcopy(model)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("error")  # the copy widens as the original does, without failing first
            assert _sqnr(twin(x), out.float()) > 30
    finally:
        applied.revert()


class _Decoder(Stack):
    def step(self, h: torch.Tensor) -> torch.Tensor:
        return self.forward(h) * 0.5


class TwoStage(nn.Module):
    """An encoder and a decoder that apps call one by one from their own code (as
    ``whisper.decode`` calls ``model.encoder`` and ``model.decoder``), a decoder method
    (``step``) the app calls too, and a forward that chains them."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.encoder = Stack(nn.Conv1d(8, 8, 1))
        self.decoder = _Decoder(block)
        self.decoder.pre = nn.Conv1d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


def _app_decode(model: TwoStage, x: torch.Tensor, entry: str) -> torch.Tensor:
    """What the app runs: the component's forward, or its children called one by one."""
    if entry == "component forward":
        return model(x)
    h = model.encoder(x)
    return model.decoder(h) if entry == "child forward" else model.decoder.step(h) * 2


class TestAnAppEnteringThroughAChild:
    """A direct child called from the app's own code is an entry of the component: a call
    of it that fails on dtypes runs again with such ops widened, named by the child."""

    ENTRIES = {"component forward": r"\(forward\)", "child forward": r"\(decoder\.forward\)",
               "child method": r"\(decoder\.step\)"}

    @pytest.mark.parametrize("entry", sorted(ENTRIES))
    @pytest.mark.parametrize("case", sorted(BLOCKS))
    def test_the_failing_call_runs_again_widened(self, case, entry):
        block, names = BLOCKS[case]
        torch.manual_seed(0)
        model = TwoStage(block()).eval()
        x = torch.randn(2, 4, 16)
        with torch.no_grad():
            ref = _app_decode(model, x, entry)
        before = _state(model)
        applied = mixprec.apply({"net": model}, BF16)
        try:
            calls = model.decoder.calls
            with pytest.warns(UserWarning, match=rf"(?s)in component 'net' {self.ENTRIES[entry]}.*{names}.*wider dtype"):
                with torch.no_grad():
                    out = _app_decode(model, x, entry)
            assert model.decoder.calls == calls + 2  # the failed call, then the one run again
            assert out.dtype == torch.float32 and _sqnr(out, ref) > 25
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # said once: later calls widen without failing first
                with torch.no_grad():
                    assert torch.equal(_app_decode(model, x, entry), out)
        finally:
            applied.revert()
        after = model.state_dict()
        assert all(torch.equal(after[k], v) and after[k].dtype == v.dtype for k, v in before.items())
        with torch.no_grad():
            assert torch.equal(_app_decode(model, x, entry), ref)
