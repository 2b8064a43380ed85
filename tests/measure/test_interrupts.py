"""A worker leaves the user's Ctrl-C to its coordinator, from its first instruction (:mod:`mixprec.measure._interrupts`).

The end-to-end check, a real Ctrl-C at several moments of ``bench`` and ``tune``, is
``tests/cli/test_cli_interrupts.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from executor_helpers import sigint_state
from mixprec.measure._interrupts import starting_children
from mixprec.measure.executor import LocalProcessExecutor

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def _blocked() -> bool:
    return signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])


@pytest.mark.parametrize("from_thread", [False, True], ids=["main thread", "another thread (a UI job)"])
def test_a_worker_ignores_sigint_and_keeps_answering(from_thread):
    started = []
    if from_thread:
        thread = threading.Thread(target=lambda: started.append(LocalProcessExecutor().start(sigint_state, {"name": "sig"})))
        thread.start()
        thread.join()
    else:
        started.append(LocalProcessExecutor().start(sigint_state, {"name": "sig"}))
    [worker] = started
    try:
        pid = worker.wait_ready(120)["pid"]
        os.kill(pid, signal.SIGINT)
        assert worker.request("state", timeout=60) == {"ignored": True, "blocked": False}
    finally:
        worker.close()
    assert not _blocked()  # this process answers Ctrl-C as before


def test_an_interrupt_while_children_start_is_raised_once_they_started():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    reached = False
    try:
        with pytest.raises(KeyboardInterrupt):
            with starting_children():
                assert _blocked()
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                reached = True  # the start ran to its end
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is back
    finally:
        signal.signal(signal.SIGINT, previous)
    assert reached and not _blocked()


#: A fresh process's first spawned child (multiprocessing starts its resource tracker then, which
#: unblocks SIGINT in the starting thread): is SIGINT still blocked for the children started after it?
FIRST_START = """
import multiprocessing, signal
from mixprec.measure._interrupts import starting_children

if __name__ == "__main__":
    with starting_children():
        child = multiprocessing.get_context("spawn").Process(target=len, args=((),))
        child.start()
        print("blocked after the first start:", signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    child.join()
"""


def test_sigint_stays_blocked_after_a_fresh_process_starts_its_first_child(tmp_path):
    script = tmp_path / "first_start.py"
    script.write_text(FIRST_START)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "blocked after the first start: True"

