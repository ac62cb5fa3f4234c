"""The simulator's workload-trace adapters (the contract: `dlrover_events.domain.workloads`;
registered in the entry-point group ``dlrover_events.workloads``)."""

from __future__ import annotations

from pathlib import Path

from dlrover_events.domain.workloads import TimedEvent, TraceError
from handlers.simulator.workload import parse_workload


def pollux_workload(path: Path, env: str) -> list[TimedEvent]:
    """A Pollux workload CSV (name,time,application,num_replicas,batch_size) as job
    submissions at their arrival second."""
    text = path.read_text()
    try:
        submissions = parse_workload(text, env=env)
    except KeyError as err:
        raise TraceError(f"cannot read {path} as a Pollux workload: no column {err}") from None
    except ValueError as err:
        raise TraceError(f"cannot read {path} as a Pollux workload: {err}") from None
    return [TimedEvent(s.time, s.event) for s in submissions]
