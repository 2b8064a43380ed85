"""Reading a process's memory: resident size now and its high-water mark since a reset.

Linux reads ``/proc/self``; elsewhere the peak from ``getrusage`` stands in for both.
"""

from __future__ import annotations

__all__ = ["rss_bytes", "reset_peak", "peak_bytes"]


def _status(field: str) -> int | None:
    """A ``/proc/self/status`` figure in bytes (``VmRSS``, ``VmHWM``), or ``None`` where there is none."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _max_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes() -> int:
    found = _status("VmRSS")
    return found if found is not None else _max_rss()


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset the peak-RSS counter (VmHWM)
        return True
    except OSError:
        return False


def peak_bytes() -> int:
    found = _status("VmHWM")
    return found if found is not None else _max_rss()
