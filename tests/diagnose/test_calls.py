"""One guarded model called from two threads: each call's state is its own, and a
fallback's re-apply never changes the weights under a call in flight."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import mixprec
from mixprec.device.hardware import probe
from mixprec.diagnose.calls import CallLock
from mixprec.diagnose.fallbacks import FallbackStore
from mixprec.policy import Policy, Rule

from guard_models import GatedOverflowingMLP, assert_fallback_output

FP16 = Policy((Rule("*", storage="fp16"),))
ROUNDS = 5


def _run(fn, results, key):
    def target():
        try:
            results[key] = fn()
        except BaseException as exc:  # handed to the main thread, which asserts on it
            results[key] = exc
    thread = threading.Thread(target=target, daemon=True)  # a regression that hangs fails, never blocks the run
    thread.start()
    return thread


def _wait_until(predicate, timeout=5.0):
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            return False
        time.sleep(0.002)
    return True


def _two_threads(model, guard, quiet, loud):
    """``quiet`` starts and waits inside the forward; ``loud`` (which overflows) runs meanwhile."""
    gate, results = model.gate, {}
    slow = _run(lambda: (setattr(gate, "hold", threading.get_ident()), model(quiet))[1], results, "quiet")
    assert gate.held.wait(5)
    fast = _run(lambda: model(loud), results, "loud")
    assert gate.passed.wait(5)  # the overflowing call is inside its forward too
    if guard.on_nonfinite == "fallback":
        # Its fallback wants to re-apply: it must wait for the call still in flight.
        assert _wait_until(lambda: guard._lock.writers_waiting == 1)
        assert "loud" not in results
    gate.release.set()
    slow.join(10)
    fast.join(10)
    assert not slow.is_alive() and not fast.is_alive()
    return results


def _sequential_pins(seed, loud, tmp_path, hardware):
    """The pins the same overflow makes on one thread (on the same probe: it decides the ladder)."""
    torch.manual_seed(seed)
    model = GatedOverflowingMLP().eval()
    with torch.no_grad(), mixprec.apply(model, FP16) as applied, pytest.warns(UserWarning, match="pinned"):
        guard = mixprec.guard(applied, on_nonfinite="fallback", store=FallbackStore(tmp_path / "sequential.json"),
                              hardware=hardware)
        model(loud)
    return {m: p.dtype for m, p in guard.pins.items()}


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_fallback_on_one_thread_leaves_the_call_in_flight_alone(round_, tmp_path):
    hardware = probe("cpu")
    torch.manual_seed(round_)
    model = GatedOverflowingMLP().eval()
    quiet, loud = torch.full((2, 4), 1e-3), torch.ones(2, 4)
    with torch.no_grad():
        loud_fp32 = model(loud)
        applied = mixprec.apply(model, FP16)
        quiet_fp16 = model(quiet)  # what the policy in force when it started gives, bit for bit
        guard = mixprec.guard(applied, on_nonfinite="fallback", store=FallbackStore(tmp_path / "f.json"),
                              hardware=hardware)
        with pytest.warns(UserWarning, match=r"pinned mlp\.up -> (bf16|fp32)"):
            results = _two_threads(model, guard, quiet, loud)
    assert not isinstance(results["quiet"], BaseException), results["quiet"]
    assert not isinstance(results["loud"], BaseException), results["loud"]
    assert torch.equal(results["quiet"], quiet_fp16)
    assert_fallback_output(results["loud"], loud_fp32, guard)
    assert {m: p.dtype for m, p in guard.pins.items()} == _sequential_pins(round_, loud, tmp_path, hardware)
    assert guard._thread.depth[""] == 0 and not guard._thread.busy
    applied.revert()


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_raise_on_one_thread_names_the_module_not_the_other_threads_input(round_, tmp_path):
    torch.manual_seed(round_)
    model = GatedOverflowingMLP().eval()
    quiet, loud = torch.full((2, 4), 1e-3), torch.ones(2, 4)
    with torch.no_grad():
        applied = mixprec.apply(model, FP16)
        quiet_fp16 = model(quiet)
        guard = mixprec.guard(applied, on_nonfinite="raise", store=FallbackStore(tmp_path / "f.json"))
        results = _two_threads(model, guard, quiet, loud)
    assert torch.equal(results["quiet"], quiet_fp16)
    error = results["loud"]
    assert isinstance(error, mixprec.NonFiniteError) and not isinstance(error, mixprec.NonFiniteInputError), error
    assert error.report.module == "mlp.up"
    applied.revert()


def test_call_lock_write_waits_for_other_threads_reads():
    lock, events = CallLock(), []
    inside, leave = threading.Event(), threading.Event()

    def reader():
        with lock.read():
            inside.set()
            leave.wait(5)
            events.append("read ends")

    def writer():
        with lock.write():
            events.append("write")

    first = threading.Thread(target=reader, daemon=True)
    first.start()
    assert inside.wait(5)
    second = threading.Thread(target=writer, daemon=True)
    second.start()
    assert _wait_until(lambda: lock.writers_waiting == 1)
    leave.set()
    first.join(5)
    second.join(5)
    assert events == ["read ends", "write"]


def test_call_lock_two_threads_inside_calls_can_both_write():
    """Two nested fallbacks at once (each thread holds a read) never wait for each other."""
    lock, order = CallLock(), []
    both_inside = threading.Barrier(2)

    def worker(name):
        with lock.read():
            both_inside.wait(5)
            with lock.write():
                order.append(name)
            with lock.read():  # the call goes on
                order.append(name + " continues")

    threads = [threading.Thread(target=worker, args=(name,), daemon=True) for name in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert sorted(order) == ["a", "a continues", "b", "b continues"]
