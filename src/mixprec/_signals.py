"""The user's interrupt (Ctrl-C) held back while a change that must be whole is made.

Python raises ``KeyboardInterrupt`` between any two bytecodes of the main thread. Where
mixprec changes something in steps (a model's weights swapped for their cast copies and
its wrappers installed, every weight put back, torch's numeric flags written), an
interrupt in between would leave the change half made. :func:`held_interrupt` holds it
until the block has ended and then raises it, so the caller sees the change made whole
(and can undo it whole) or not at all.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

__all__ = ["held_interrupt"]


@contextlib.contextmanager
def held_interrupt() -> Iterator[None]:
    """Hold a Ctrl-C that comes while the block runs; once the block has ended, the interrupt's
    handler runs (``KeyboardInterrupt`` by default), as if it had come then.

    Only the main thread receives signals: elsewhere, and where SIGINT is not handled by a
    Python function (ignored, or left to the system), the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        yield
        return
    held: list[tuple[int, Any]] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        if held:
            handler(*held[0])
