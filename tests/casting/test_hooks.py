"""The casting hooks' per-call state belongs to the calling thread."""

from __future__ import annotations

import threading

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
    thread = threading.Thread(target=target)
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
