"""Resource probes: what a node uses, read in the reporter's thread once per sample.

Probes run off the training thread, so they may take a millisecond; they must not raise
for long (the reporter disables a probe that keeps failing). Each returns some fields of
``schemas.jobs.NodeUsage``; later probes override earlier ones.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any

#: A probe returns NodeUsage fields: cpu (cores), memory (bytes), gpu_util (0..1),
#: gpu_memory (bytes).
Probe = Callable[[], dict[str, Any]]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident memory of this process now: what the kernel's OOM killer weighs.

    /proc/self/statm is one small read on Linux; elsewhere the peak (ru_maxrss) is the
    best the standard library offers, and over-reporting is the safe side for sizing.
    """
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)


def process_started_at(pid: int | str = "self") -> float | None:
    """Wall-clock time the process started (Linux: /proc), None where it cannot be read:
    a restarted worker's phases count from there, torch's import included."""
    try:
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        with open(f"/proc/{pid}/stat", "rb") as f:
            # the command may hold spaces and parentheses: fields count after the last ')'
            fields = f.read().rsplit(b")", 1)[1].split()
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class HostProbe:
    """Host memory (RSS) and CPU cores used by the whole process since the last call."""

    def __init__(self) -> None:
        self._cpu = time.process_time()
        self._wall = time.monotonic()

    def __call__(self) -> dict[str, Any]:
        cpu, wall = time.process_time(), time.monotonic()
        elapsed = wall - self._wall
        cores = (cpu - self._cpu) / elapsed if elapsed > 0 else 0.0
        self._cpu, self._wall = cpu, wall
        return {"memory": rss_bytes(), "cpu": round(max(cores, 0.0), 3)}
