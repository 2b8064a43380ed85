"""When the ``mixprec`` process started: a ``--budget`` counts from there."""

from __future__ import annotations

import os
import time

__all__ = ["process_started", "as_script"]

#: True when the command runs as the ``mixprec`` program (:func:`mixprec.cli.main`), so a
#: ``--budget`` counts from the start of the process (starting Python and importing torch
#: included); False inside another program, where it counts from the command.
as_script = False


def process_started(*, proc: str = "/proc") -> float:
    """When this process started, on the ``time.monotonic`` clock.

    Read from ``/proc/self/stat`` and ``/proc/uptime`` (Linux) when running as the
    ``mixprec`` program; elsewhere, or inside another program: now. At most 10 minutes
    back (a process that started long before the command is not the program's start).
    """
    now = time.monotonic()
    if not as_script:
        return now
    try:
        with open(os.path.join(proc, "self", "stat"), encoding="ascii") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open(os.path.join(proc, "uptime"), encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - min(max(0.0, age), 600.0)
