"""Workload adapters: turn a trace file (a Pollux workload CSV, ...) into timed events.

Adapters live where their knowledge lives (the Pollux adapter needs the simulator's
application models, in handlers/) and are found through the entry-point group
``dlrover_events.workloads``, so replay can use them without importing handlers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from pathlib import Path

from schemas.envelope import Event

WORKLOAD_GROUP = "dlrover_events.workloads"

#: (trace file, env) -> (seconds from the trace's start, event), in any order.
WorkloadAdapter = Callable[[Path, str], Sequence[tuple[float, Event]]]


def discover_workload_adapters() -> dict[str, WorkloadAdapter]:
    return {ep.name: ep.load() for ep in sorted(entry_points(group=WORKLOAD_GROUP), key=str)}
