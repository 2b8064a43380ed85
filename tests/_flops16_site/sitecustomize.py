"""Count the 16-bit FLOPs of a Python subprocess a counted test starts (tests/_flops16.py).

The plugin puts this folder first on ``PYTHONPATH`` and names, in ``FLOPS16_COUNT_TO``,
the file prefix of the test running; a subprocess started then (a benchmark worker,
``python -m mixprec``) loads this module at start-up. Nothing happens unless the process
imports torch: then, once torch has loaded, :class:`flops16_count.Flops16Mode` runs on the
main thread and on every thread started later, for the rest of the process. The process's
file ``<prefix>-<pid>.cnt`` is written when it starts (one file: one process started) and
rewritten in place at every count (four numbers: bf16, fp16 and fp32 FLOPs, and the pipelines
built, each a ``mixprec.pipelines.build`` audit event), so a worker that is killed rather
than left to exit has still reported what it did.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_PREFIX = os.environ.get("FLOPS16_COUNT_TO")
#: Loaded from this folder by path: ``multiprocessing``'s spawn replaces ``sys.path`` with the parent's.
_COUNTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flops16_count.py")


#: The counts the file holds, in order.
_COUNTS = ("bf16", "fp16", "fp32", "builds")
#: The audit event of a pipeline built.
_BUILD_EVENT = "mixprec.pipelines.build"


class _File:
    """This process's counts, rewritten in place in its file at every change."""

    def __init__(self, path: str) -> None:
        import threading

        self.totals = dict.fromkeys(_COUNTS, 0)
        self.lock = threading.Lock()
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self._write()

    def add(self, name: str, count: int) -> None:
        with self.lock:
            self.totals[name] += count
            self._write()

    def _write(self) -> None:
        os.pwrite(self.fd, (" ".join(f"{self.totals[name]:021d}" for name in _COUNTS) + "\n").encode(), 0)


def _start_counting(file: _File) -> None:
    """Count on the main thread from now on, and on every thread started later (a Ray actor runs
    its job on one), all into this process's file."""
    import threading

    spec = importlib.util.spec_from_file_location("flops16_count", _COUNTER)
    counter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(counter)

    def count_new_thread(frame, event, arg):
        sys.setprofile(None)
        from torch.utils._python_dispatch import _push_mode

        _push_mode(counter.Flops16Mode(on_count=file.add))  # for the thread's life

    counter.Flops16Mode(on_count=file.add).__enter__()
    threading.setprofile(count_new_thread)


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``torch`` is first imported, runs :func:`_start_counting` after it loads."""

    def __init__(self, file: _File) -> None:
        self.file = file

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
            _start_counting(self.file)

        spec.loader.exec_module = exec_module
        return spec


if _PREFIX:
    _file = _File(f"{_PREFIX}-{os.getpid()}.cnt")
    sys.addaudithook(lambda event, args: _file.add("builds", 1) if event == _BUILD_EVENT else None)
    if "torch" not in sys.modules:
        sys.meta_path.insert(0, _AfterTorch(_file))
