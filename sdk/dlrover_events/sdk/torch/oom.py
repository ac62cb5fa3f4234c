"""Recognising an OOM in what torch raises: which memory ran out, and how much was asked.

torch's CUDA allocator raises ``torch.cuda.OutOfMemoryError``; its CPU allocator a plain
RuntimeError; Python a MemoryError. The brain sizes the next attempt from the numbers, so
the failed request is read back out of torch's message.
"""

from __future__ import annotations

import re

import torch

from schemas.jobs import OOMKind

_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_GPU_REQUEST = re.compile(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)")
_CPU_REQUEST = re.compile(r"tried to allocate ([0-9]+) bytes")
#: torch's CPU allocator fails with a RuntimeError, not MemoryError.
_CPU_OOM = "DefaultCPUAllocator: can't allocate memory"


def requested_bytes(err: BaseException) -> int:
    """The allocation that failed, as torch's message says it; 0 when it does not."""
    text = str(err)
    if m := _GPU_REQUEST.search(text):
        return int(float(m.group(1)) * _UNITS[m.group(2)])
    if m := _CPU_REQUEST.search(text):
        return int(m.group(1))
    return 0


def oom_kind(err: BaseException) -> OOMKind | None:
    """Which memory ran out, or None when ``err`` is not an OOM."""
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return OOMKind.GPU_MEMORY
    if isinstance(err, MemoryError) or (isinstance(err, RuntimeError) and _CPU_OOM in str(err)):
        return OOMKind.HOST_MEMORY
    return None


__all__ = ["oom_kind", "requested_bytes"]
