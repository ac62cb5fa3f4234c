"""What a virtual env's operator must keep across a restart, as bytes and back.

The simulated cluster lives in memory; a consumer that commits its offsets once a batch is
handled would otherwise forget every job it had been told about (every later plan: "unknown
job"). So the operator saves, before it publishes anything and before it commits, one
checkpoint: the cluster (jobs, pods, progress, clock), the lockstep tick, the offset up to
which each input partition is in it, and the events it is about to publish. Restored, the
operator says from then on what it would have said had it never stopped: the simulator is
deterministic, and an input re-read below the saved offsets is skipped, not applied again.

Pure: no I/O. The operator (handlers.operator.virtual.operator) stores the bytes in its env's
Postgres schema.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from handlers.simulator.cluster import Cluster
from handlers.simulator.curves import LearningCurve
from handlers.simulator.fleet import Loader, VirtualCluster
from handlers.simulator.lockstep import TickClock, TickGate
from handlers.simulator.throughput import load_application
from handlers.simulator.trial import Reporting
from schemas.codec import decode, encode
from schemas.envelope import Event
from schemas.plans import ScalePlan

#: Bumped when the layout changes; a checkpoint of another version is refused with a reason.
#: 2: the admission (cluster or brain), each job's claim to pods and its pinned nodes.
#: 3: the plans kept for jobs that have not arrived yet on the simulated clock.
#: 4: the searcher's inputs read and not yet taken, and what was said to the searcher.
VERSION = 4

#: Versions this code restores: a version-1 checkpoint is of a cluster that admitted its
#: jobs itself and pinned none, one of version 2 kept no plans for jobs still to arrive
#: (what the absent fields default to), one of version 3 had no searcher's inputs.
READABLE = frozenset({1, 2, 3, VERSION})

#: An input partition: (full topic name, partition).
TopicPartition = tuple[str, int]


class CheckpointError(Exception):
    """Bytes that are not a checkpoint this code can restore; the message says why."""


@dataclass(frozen=True, slots=True)
class Outgoing:
    """An event to publish: keyed as events are, or, with ``broadcast`` (full topic names),
    to every partition of each of those topics (a lockstep barrier)."""

    event: Event
    broadcast: tuple[str, ...] = ()


@dataclass
class OperatorState:
    """Everything a restarted operator needs to go on where it stood."""

    fleet: VirtualCluster | None = None
    ticks: TickClock | None = None
    gate: TickGate | None = None
    #: next offset of each input partition that the fleet and the gate include
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    #: events made but not yet known to be published, in the order to publish them
    outbox: list[Outgoing] = field(default_factory=list)
    #: something was published since the last lockstep barrier
    unbarriered: bool = False
    #: the searcher's inputs read and not yet taken: the clock's next stop takes them, in
    #: one order (handlers/operator/virtual/trials.py, canonical)
    pending: list[Event] = field(default_factory=list)
    #: per partition of a topic the searcher reads, the offset after the last record
    #: published there: what the searcher must have decided before the clock moves on
    said: dict[TopicPartition, int] = field(default_factory=dict)

    def fresh(self, topic: str, partition: int, offset: int) -> bool:
        """Whether a record read is new to this state: one below the saved offset was
        handled before the restart and is in the state already."""
        return offset >= self.offsets.get((topic, partition), 0)

    def consumed(self, topic: str, partition: int, offset: int) -> None:
        key = (topic, partition)
        self.offsets[key] = max(self.offsets.get(key, 0), offset + 1)


def dump(state: OperatorState) -> bytes:
    return orjson.dumps(
        {
            "version": VERSION,
            "fleet": None if state.fleet is None else state.fleet.snapshot(),
            "ticks": None if state.ticks is None else state.ticks.snapshot(),
            "gate": None if state.gate is None else state.gate.snapshot(),
            "offsets": [[t, p, o] for (t, p), o in sorted(state.offsets.items())],
            "outbox": [[encode(o.event).decode(), list(o.broadcast)] for o in state.outbox],
            "unbarriered": state.unbarriered,
            "pending": [encode(e).decode() for e in state.pending],
            "said": [[t, p, o] for (t, p), o in sorted(state.said.items())],
        }
    )


def load(
    data: bytes,
    *,
    source: str = "virtual-operator",
    loader: Loader = load_application,
    published: bool = False,
    curve: LearningCurve | None = None,
    reporting: Reporting = Reporting(),
) -> OperatorState:
    """The state saved in ``data``; ``published``: its outbox is known to be on the bus
    (left out); ``curve`` and ``reporting``: what its trials follow (the operator's
    settings, not the checkpoint's). CheckpointError says why it cannot be restored; a
    TraceDataError from ``loader`` says that an application's traces are gone."""
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise CheckpointError(f"not a checkpoint: {e}") from None
    found = raw.get("version") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or type(found) is not int or found not in READABLE:
        readable = " or ".join(str(v) for v in sorted(READABLE))
        raise CheckpointError(f"checkpoint version {found!r}; this operator reads {readable}")
    try:
        return OperatorState(
            fleet=None
            if raw["fleet"] is None
            else VirtualCluster.restore(
                raw["fleet"], source=source, loader=loader, curve=curve, reporting=reporting
            ),
            ticks=None if raw["ticks"] is None else TickClock.restore(raw["ticks"]),
            gate=None if raw["gate"] is None else TickGate.restore(raw["gate"]),
            offsets={(t, p): o for t, p, o in raw["offsets"]},
            outbox=[] if published else [_outgoing(text, to) for text, to in raw["outbox"]],
            unbarriered=raw["unbarriered"],
            pending=[decode(text.encode()) for text in raw.get("pending", [])],
            said={(t, p): o for t, p, o in raw.get("said", [])},
        )
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"a damaged checkpoint: {type(e).__name__}: {e}") from None


def _outgoing(text: str, broadcast: Iterable[str]) -> Outgoing:
    return Outgoing(decode(text.encode()), tuple(broadcast))


def shape_differs(fleet: VirtualCluster, wanted: Cluster) -> str | None:
    """How the restored cluster differs from the one the options ask for, if it does: its
    jobs hold pods on its nodes, so it keeps its shape (the caller says so)."""
    have, want = fleet.cluster.shape, wanted.shape
    if have == want:
        return None
    return (
        f"{have[0]} nodes x {have[1]} GPUs (asked: {want[0]} x {want[1]})"
        if have[:2] != want[:2]
        else f"nodes of {have[2]:g} cores and {have[3]} bytes (asked: {want[2]:g}, {want[3]})"
    )


def tick_clock_for(fleet: VirtualCluster | None, tick_s: float) -> TickClock:
    """A tick clock for a cluster whose clock may have run already (a checkpoint made out
    of lockstep): its grid starts at the first tick end not before the cluster's clock."""
    clock = 0.0 if fleet is None else fleet.clock
    return TickClock(tick_s, grid=math.ceil(clock / tick_s - 1e-9) if clock > 0 else 0)


def held_plans(gate: TickGate | None) -> list[ScalePlan]:
    """Plans a lockstep gate held, in the order it would have applied them (for an
    operator restarted out of lockstep, which applies them at once)."""
    if gate is None:
        return []
    ordered: list[ScalePlan] = []
    for tick in sorted(gate.held_ticks()):
        ordered.extend(gate.held(tick))
    return ordered


def summary(state: OperatorState) -> Mapping[str, Any]:
    """A few figures for the operator's log line after a restore."""
    fleet = state.fleet
    return {
        "jobs": 0 if fleet is None else len(fleet.jobs()),
        "clock_s": 0.0 if fleet is None else fleet.clock,
        "tick": None if state.ticks is None else state.ticks.number,
        "unpublished": len(state.outbox),
    }


__all__ = [
    "READABLE",
    "VERSION",
    "CheckpointError",
    "OperatorState",
    "Outgoing",
    "dump",
    "held_plans",
    "load",
    "shape_differs",
    "summary",
    "tick_clock_for",
]
