"""A command run as a terminal runs it, for the tests that interrupt it with a real Ctrl-C.

:func:`start` runs it in a session of its own (its process group is what a terminal's
Ctrl-C reaches) with SIGINT answered as in a terminal: a test process may ignore SIGINT (a
pytest-xdist worker that started a Ray cluster does), and a child inherits an ignored
signal, so the child is started while this process handles it (handled signals are reset to
the default in a new program). :func:`session` lists the live processes of a session; :func:`wait_for` waits for a moment of the command;
:func:`interrupt` runs a command, sends it a Ctrl-C at a moment and checks that it ended whole.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any, Callable

import pytest

__all__ = ["start", "session", "wait_for", "interrupt", "UNCOUNTED"]

#: The interrupted command runs without the 16-bit FLOP counter: its process-long dispatch mode can abort
#: Python's teardown after a Ctrl-C ("terminate called without an active exception"), which no user's
#: process has; the 16-bit work here is a few kFLOP.
UNCOUNTED = pytest.mark.flops16_off("a Ctrl-C'd command's teardown under the counter's process-long dispatch mode can abort")


def start(args: list[str], **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen(args)`` in a new session, its output (both streams) as text on ``stdout``."""
    handled = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler) if handled else None
    try:
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                **popen)
    finally:
        if handled:
            signal.signal(signal.SIGINT, previous)


def session(sid: int) -> dict[int, str]:
    """The live processes of session ``sid``: pid -> command line (zombies, already ended, left out)."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if int(fields[3]) != sid or fields[0] == "Z":
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                found[int(entry)] = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
    return found


def wait_for(what: str, ready: Callable[[], Any], proc: subprocess.Popen, within_s: float) -> None:
    """Wait until ``ready()``; the test fails if the command ends first, or after ``within_s`` seconds
    (a bound on a hang on a busy machine, never a timing assertion)."""
    deadline = time.monotonic() + within_s
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the command ended before {what}: exit status {proc.returncode}\n{proc.stdout.read()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not come within {within_s:.0f} s")
        time.sleep(0.02)


def interrupt(args: list[str], what: str, ready: Callable[[subprocess.Popen], Any], within_s: float,
              **popen: Any) -> tuple[int, str]:
    """Run ``args`` as :func:`start` does, send SIGINT to its process group once ``ready(proc)``, and return
    its exit status and output. The test fails unless the command and every process of its session
    ended, and its output holds no traceback; whatever fails, nothing of it is left running."""
    proc = start(args, **popen)
    try:
        wait_for(what, lambda: ready(proc), proc, within_s)
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=within_s)
        # every process the command started ended with it (the resource tracker ends once its pipe closes)
        deadline = time.monotonic() + 30
        while session(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert session(proc.pid) == {}, output
    finally:
        for pid in session(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.wait()
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    return proc.returncode, output
