"""What a host has for pods: its GPUs as nvidia-smi lists them, or artificial slots on a
CPU-only host (Determined's ``artificial_slots``).

``parse_gpus`` is pure (nvidia-smi's CSV in, slots out, a line it cannot read named in the
error); ``discover`` runs nvidia-smi.
"""

from __future__ import annotations

import shutil
import subprocess

from schemas.hosts import Slot

#: What ``discover`` asks nvidia-smi, in this order.
QUERY = "index,name,uuid,memory.total"
NVIDIA_SMI = ("nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits")
MiB = 2**20


class UnreadableGpus(ValueError):
    """nvidia-smi said something that is not its CSV of GPUs."""


def parse_gpus(text: str) -> list[Slot]:
    """nvidia-smi's ``--query-gpu=index,name,uuid,memory.total --format=csv,noheader,nounits``
    as slots, in its order. A GPU whose memory nvidia-smi cannot say (``[N/A]``) has none;
    an index listed twice, or a line of other than four fields, is UnreadableGpus."""
    slots: list[Slot] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4:
            raise UnreadableGpus(f"nvidia-smi line {number}: {len(fields)} fields, not 4: {line!r}")
        index, name, uuid, memory = fields
        if not index.isdigit():
            raise UnreadableGpus(f"nvidia-smi line {number}: index {index!r} is not a number")
        try:
            mib = int(float(memory))
        except ValueError:
            mib = -1
        try:
            slots.append(
                Slot(
                    index=int(index),
                    name=name or None,
                    uuid=uuid or None,
                    memory=mib * MiB if mib >= 0 else None,
                )
            )
        except ValueError as e:
            raise UnreadableGpus(f"nvidia-smi line {number}: {e}") from None
    if len({s.index for s in slots}) != len(slots):
        raise UnreadableGpus("nvidia-smi listed a GPU index twice")
    return slots


def artificial(count: int) -> list[Slot]:
    """``count`` slots of a CPU-only host: indexes only."""
    return [Slot(index=i) for i in range(count)]


def discover(artificial_slots: int | None) -> tuple[list[Slot], bool]:
    """The host's slots, and whether they are artificial: the setting when given, else
    nvidia-smi's GPUs (none where it is not installed or finds none)."""
    if artificial_slots is not None:
        return artificial(artificial_slots), True
    if shutil.which(NVIDIA_SMI[0]) is None:
        return [], False
    done = subprocess.run(NVIDIA_SMI, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        return [], False
    return parse_gpus(done.stdout), False


__all__ = ["NVIDIA_SMI", "UnreadableGpus", "artificial", "discover", "parse_gpus"]
