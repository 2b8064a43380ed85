"""Count the 16-bit FLOPs of a Python subprocess a counted test starts (tests/_flops16.py).

The plugin puts this folder first on ``PYTHONPATH`` and names, in ``FLOPS16_COUNT_TO``,
the file prefix of the test running; a subprocess started then (a benchmark worker,
``python -m mixprec``) loads this module at start-up. Nothing happens unless the process
imports torch: then, once torch has loaded, :class:`flops16_count.Flops16Mode` runs on the
main thread and on every thread started later, for the rest of the process, and every count
is written at once to ``<prefix>-<pid>.cnt`` (two numbers, bf16 and fp16, rewritten in
place), so a worker that is killed rather than left to exit has still reported what it computed.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_PREFIX = os.environ.get("FLOPS16_COUNT_TO")
#: Loaded from this folder by path: ``multiprocessing``'s spawn replaces ``sys.path`` with the parent's.
_COUNTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flops16_count.py")


def _start_counting() -> None:
    """Count on the main thread from now on, and on every thread started later (a Ray actor runs
    its job on one), all into this process's file."""
    import threading

    spec = importlib.util.spec_from_file_location("flops16_count", _COUNTER)
    counter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(counter)
    path = f"{_PREFIX}-{os.getpid()}.cnt"
    totals = dict.fromkeys(counter.DTYPES.values(), 0)
    lock = threading.Lock()
    fd: list[int] = []

    def add(name: str, flops: int) -> None:
        with lock:
            totals[name] += flops
            if not fd:
                fd.append(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
            os.pwrite(fd[0], f"{totals['bf16']:021d} {totals['fp16']:021d}\n".encode(), 0)

    def count_new_thread(frame, event, arg):
        sys.setprofile(None)
        from torch.utils._python_dispatch import _push_mode

        _push_mode(counter.Flops16Mode(on_count=add))  # for the thread's life

    counter.Flops16Mode(on_count=add).__enter__()
    threading.setprofile(count_new_thread)


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``torch`` is first imported, runs :func:`_start_counting` after it loads."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _start_counting()

        spec.loader.exec_module = exec_module
        return spec


if _PREFIX and "torch" not in sys.modules:
    sys.meta_path.insert(0, _AfterTorch())
