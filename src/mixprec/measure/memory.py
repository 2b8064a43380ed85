"""Reading a process's memory: resident size now and its high-water mark since a reset.

Linux reads ``/proc/self``; elsewhere the peak from ``getrusage`` stands in for both.
"""

from __future__ import annotations

__all__ = ["rss_bytes", "reset_peak", "peak_bytes"]


def rss_bytes() -> int:
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset the peak-RSS counter (VmHWM)
        return True
    except OSError:
        return False


def peak_bytes() -> int:
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
