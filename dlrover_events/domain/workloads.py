"""The workload-trace extension point: an adapter turns a trace file (a Pollux workload
CSV, ...) into the events of the jobs it describes, each at its second from the trace's
start.

Adapters live where their knowledge lives (the Pollux one needs the simulator's models of
applications: `handlers/simulator/adapters.py`) and are registered by name in the
entry-point group ``dlrover_events.workloads`` of pyproject.toml, so replay and the A/B
runs (in streams/) find them without importing handlers/. `trace_adapters()` lists them;
`read_trace` reads a trace with one, in time order, and says what is wrong in one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import NamedTuple, Protocol

from dlrover_events.errors import UserError
from schemas.envelope import Event

WORKLOAD_GROUP = "dlrover_events.workloads"


class TimedEvent(NamedTuple):
    """An event of a trace, at its second from the trace's start."""

    seconds: float
    event: Event


class TraceAdapter(Protocol):
    """(trace file, env) -> the trace's events for that env, in any order. A trace it
    cannot read is a TraceError saying why (read_trace also takes a ValueError, KeyError
    or OSError of an adapter for one)."""

    def __call__(self, path: Path, env: str, /) -> Sequence[TimedEvent]: ...


class TraceError(UserError):
    """A trace that cannot be read as asked: the file, the adapter and why, in one line."""


class UnknownTraceAdapter(TraceError):
    """A name no adapter is registered under; the message names the installed ones."""


def trace_adapters() -> dict[str, TraceAdapter]:
    """The installed adapters by name."""
    return {ep.name: ep.load() for ep in sorted(entry_points(group=WORKLOAD_GROUP), key=str)}


def read_trace(path: Path, env: str, adapter: str = "pollux") -> list[TimedEvent]:
    """The trace's events for `env`, in time order (a tie keeps the adapter's order)."""
    adapters = trace_adapters()
    read = adapters.get(adapter)
    if read is None:
        known = ", ".join(adapters) or "none installed"
        raise UnknownTraceAdapter(f"unknown workload adapter {adapter!r}; known: {known}")
    try:
        timed = [TimedEvent(*pair) for pair in read(path, env)]
    except TraceError:
        raise
    except OSError as err:
        raise TraceError(f"cannot read {path}: {err.strerror or err}") from None
    except (ValueError, KeyError) as err:
        raise TraceError(f"cannot read {path} as a {adapter} workload: {err}") from None
    return sorted(timed, key=lambda timed_event: timed_event.seconds)


__all__ = [
    "WORKLOAD_GROUP",
    "TimedEvent",
    "TraceAdapter",
    "TraceError",
    "UnknownTraceAdapter",
    "read_trace",
    "trace_adapters",
]
