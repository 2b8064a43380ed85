"""The casting hooks' per-call state belongs to the calling thread."""

from __future__ import annotations

import threading
import warnings

import torch
from torch import nn

import mixprec
from mixprec.policy import Policy, Rule

FP16 = Policy((Rule("*", storage="fp16"),))


class Pause(nn.Module):
    """Threads registered in ``waits`` stop here until released."""

    def __init__(self):
        super().__init__()
        self.waits: dict[int, tuple[threading.Event, threading.Event]] = {}

    def hold_this_thread(self) -> tuple[threading.Event, threading.Event]:
        return self.waits.setdefault(threading.get_ident(), (threading.Event(), threading.Event()))

    def forward(self, x):
        events = self.waits.get(threading.get_ident())
        if events is not None:
            events[0].set()
            if not events[1].wait(10):
                raise TimeoutError("never released")
        return x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.pause = Pause()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(self.pause(x))


def _start(fn, results, key):
    def target():
        try:
            results[key] = fn()
        except BaseException as exc:  # the main thread asserts on it
            results[key] = exc
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_overlapping_calls_each_get_their_own_callers_dtype_back():
    torch.manual_seed(0)
    net = Net().eval()
    holds: dict[str, tuple[threading.Event, threading.Event]] = {}
    results: dict[str, object] = {}

    def call(key, dtype):
        holds[key] = net.pause.hold_this_thread()
        return net(torch.randn(2, 4, dtype=dtype))

    with torch.no_grad(), mixprec.apply(net, FP16):
        first = _start(lambda: call("first", torch.float32), results, "first")
        assert _arrived(holds, "first")
        second = _start(lambda: call("second", torch.float64), results, "second")
        assert _arrived(holds, "second")
        holds["first"][1].set()  # the first call leaves while the second is still inside
        first.join(10)
        holds["second"][1].set()
        second.join(10)
    assert results["first"].dtype == torch.float32, results["first"]
    assert results["second"].dtype == torch.float64, results["second"]


def test_app_code_on_one_thread_is_not_module_code_because_another_thread_is_inside():
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 4)
    holds: dict[str, tuple[threading.Event, threading.Event]] = {}
    results: dict[str, object] = {}

    def inside():
        holds["inside"] = net.pause.hold_this_thread()
        return net(x)

    with torch.no_grad(), mixprec.apply(net, FP16):
        alone = net.lin(x)  # a direct call of a child from app code hands back the caller's dtype
        assert alone.dtype == torch.float32
        thread = _start(inside, results, "inside")
        assert _arrived(holds, "inside")
        during = net.lin(x)
        holds["inside"][1].set()
        thread.join(10)
    assert during.dtype == torch.float32 and torch.equal(during, alone)
    assert results["inside"].dtype == torch.float32


def _arrived(holds, key, timeout=5.0):
    import time

    end = time.monotonic() + timeout
    while key not in holds:
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return holds[key][0].wait(timeout)


class PausedScale(nn.Module):
    """Owns a weight and has no functional fp32 path: fp32 compute swaps fp32 copies into it."""

    def __init__(self):
        super().__init__()
        self.pause = Pause()
        self.weight = nn.Parameter(torch.eye(4) * 0.5)

    def forward(self, x):
        x = self.pause(x)
        return torch.nn.functional.linear(x, self.weight)  # needs x and the weight in one dtype


def test_fp32_compute_swapping_copies_in_is_one_call_at_a_time():
    import time

    net = PausedScale().eval()
    weight = net.weight
    holds: dict[str, tuple[threading.Event, threading.Event]] = {}
    results: dict[str, object] = {}

    def call(key):
        holds[key] = net.pause.hold_this_thread()
        return net(torch.ones(2, 4))

    with torch.no_grad(), mixprec.apply(net, Policy((Rule("*", storage="bf16", compute="fp32"),))), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = _start(lambda: call("first"), results, "first")
        assert _arrived(holds, "first")
        second = _start(lambda: call("second"), results, "second")
        time.sleep(0.05)  # the second call starts while the first has fp32 copies swapped in
        holds["first"][1].set()
        first.join(10)
        assert _arrived(holds, "second")
        holds["second"][1].set()
        second.join(10)
        assert net.weight is weight and weight.dtype == torch.bfloat16
    assert [str(w.message) for w in caught] == []  # no call saw another call's weights come and go
    assert net.weight is weight and weight.dtype == torch.float32
    for key in ("first", "second"):
        assert torch.equal(results[key], torch.full((2, 4), 0.5)), results[key]


def test_per_thread_hook_state_copies_as_empty():
    """Deep-copying an applied model copies its hooks: their per-thread state comes out fresh."""
    import copy

    from mixprec.casting.hooks import Boundary, CallStack, EntryBoundary, EntryGate

    gate = EntryGate()
    gate.depth = 2
    lin = nn.Linear(2, 2)
    boundary = Boundary(lin, lambda: torch.bfloat16, lambda: None, gate=gate)
    boundary.caller_dtypes.append((torch.float32, True))
    entry = EntryBoundary(lin, lambda: torch.bfloat16, gate)
    entry.boundary.caller_dtypes.append((torch.float32, False))
    clone = copy.deepcopy({"gate": gate, "boundary": boundary, "entry": entry, "stack": CallStack()})
    assert clone["gate"].depth == 0 and clone["gate"] is not gate
    assert clone["boundary"].caller_dtypes == [] and clone["boundary"].gate is clone["gate"]
    assert clone["entry"].boundary.caller_dtypes == [] and clone["entry"].gate is clone["gate"]
    assert clone["stack"].items == []
    assert gate.depth == 2 and boundary.caller_dtypes == [(torch.float32, True)]  # the originals keep theirs


def test_fp32_compute_of_an_embedding_widens_only_the_rows_it_reads():
    """Bit-identical to a lookup in the widened table, without widening the table per call."""
    import torch.nn.functional as F

    from mixprec.casting.fp32compute import ComputeIn

    table = torch.nn.Embedding(1000, 16, padding_idx=0).to(torch.bfloat16)
    ids = torch.randint(0, 1000, (2, 9))
    wrapper = ComputeIn(torch.float32).install(table)
    widened: list[torch.Tensor] = []
    original_widen = wrapper.widen
    wrapper.widen = lambda t, entry: widened.append(t) or original_widen(t, entry)  # type: ignore[method-assign]
    out = table(ids)
    wrapper.remove()
    assert out.dtype == torch.float32 and torch.equal(out, F.embedding(ids, table.weight.float(), 0))
    assert [tuple(t.shape) for t in widened] == [(2, 9, 16)]  # the rows read, not the 1000-row table


def test_a_hooked_method_shows_its_own_signature_without_unwrapping():
    # Code that inspects a method while traced (transformers' apply_chunking_to_forward counts
    # its parameters) must stop at the wrapper: unwrapping to the bound method takes an id()
    # that torch 2.11's Dynamo cannot trace.
    import inspect

    from mixprec.casting.hooks import add_method_hook

    class Chunked(torch.nn.Module):
        def chunk(self, hidden, scale=1.0):
            return hidden * scale

        def forward(self, hidden):
            return self.chunk(hidden)

    module = Chunked()
    handle = add_method_hook(module, "chunk", lambda call, a, k: call(*a, **k))
    wrapper = module.chunk
    assert wrapper is not Chunked.chunk.__get__(module) and "chunk" in module.__dict__
    assert list(inspect.signature(wrapper).parameters) == ["hidden", "scale"]
    assert inspect.unwrap(wrapper, stop=lambda f: hasattr(f, "__signature__")) is wrapper
    handle.remove()
    assert "chunk" not in module.__dict__
