"""Workload adapters for replay (entry-point group ``dlrover_events.workloads``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from handlers.simulator.workload import parse_workload
from schemas.envelope import Event


def pollux_workload(path: Path, env: str) -> Sequence[tuple[float, Event]]:
    """A Pollux workload CSV as job submissions at their arrival second."""
    return [(s.time, s.event) for s in parse_workload(path.read_text(), env=env)]
