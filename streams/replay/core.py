"""The pure half of replay: which records to copy, in what order, and when.

The copier feeds records from several partitions; the k-way merge here interleaves them
by time while never reordering a partition, and one job's records all live in one
partition (keyed by job), so per-job order is preserved by construction.
"""

from __future__ import annotations

import fnmatch
import heapq
from collections import deque
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar

from schemas.envelope import Event
from schemas.jobs import JobSubmitted, RuntimeSample
from schemas.lockstep import Barrier, BarrierAck
from schemas.plans import ScalePlan

K = TypeVar("K", bound=Hashable)

#: What a virtual env takes from production by default: arrivals and what jobs are like.
#: Outcomes (node events, completions) come from the env's own simulator instead.
DEFAULT_TYPES: tuple[str, ...] = ("job.submitted", "optimize.request", "job.runtime_sample")

#: The config key of a replayed submission that says the global step of the job's last
#: sample in the source env: how long the job trained there, for a simulator that must
#: run it from its first phase (handlers/simulator/measured.py reads the same key) when
#: the job does not say itself (``total_steps``). The brain reads no such key.
SOURCE_STEPS = "replay_source_steps"


@dataclass(frozen=True, slots=True)
class Recorded:
    """A record as read from the source: where it was, when, and its decoded event."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    event: Event | None  # None: the bytes did not decode (copied as they are)
    value: bytes | None


class TimeMerge(Generic[K]):
    """A streaming k-way merge by timestamp that never reorders one stream.

    Only the head of each stream competes, so a record never overtakes an earlier record
    of its own partition even where timestamps go backwards. A record is released only
    when every open stream has a head buffered: ``needs()`` says which to read next.
    """

    def __init__(self, keys: Iterable[K]) -> None:
        self._buffers: dict[K, deque[Recorded]] = {k: deque() for k in keys}
        self._open: set[K] = set(self._buffers)
        self._heap: list[tuple[int, int, K]] = []
        self._in_heap: set[K] = set()
        self._seq = 0

    def needs(self) -> list[K]:
        return [k for k in self._buffers if k in self._open and not self._buffers[k]]

    def add(self, key: K, records: Iterable[Recorded]) -> None:
        self._buffers[key].extend(records)
        self._push_head(key)

    def close(self, key: K) -> None:
        """The stream has nothing more (until its end offset, or for good)."""
        self._open.discard(key)

    @property
    def done(self) -> bool:
        return not self._open and not self._heap

    def pop(self) -> Recorded | None:
        """The earliest head, or None while some open stream has no head yet."""
        if self.needs() or not self._heap:
            return None
        _, _, key = heapq.heappop(self._heap)
        self._in_heap.discard(key)
        record = self._buffers[key].popleft()
        self._push_head(key)
        return record

    def _push_head(self, key: K) -> None:
        buf = self._buffers[key]
        if buf and key not in self._in_heap:
            heapq.heappush(self._heap, (buf[0].timestamp_ms, self._seq, key))
            self._in_heap.add(key)
            self._seq += 1


def merge_in_time(streams: Sequence[Iterable[Recorded]]) -> Iterator[Recorded]:
    """Merge whole streams at once (traces, tests): TimeMerge over plain iterables."""
    merge: TimeMerge[int] = TimeMerge(range(len(streams)))
    for i, stream in enumerate(streams):
        merge.add(i, stream)
        merge.close(i)
    while (record := merge.pop()) is not None:
        yield record


@dataclass(frozen=True, slots=True)
class Pacer:
    """When each record is due, relative to the first, at ``speed`` x real time.

    ``speed=None`` means as fast as possible: everything is due at once.
    """

    speed: float | None

    def due_s(self, first_ms: int, ts_ms: int) -> float:
        if self.speed is None:
            return 0.0
        return max(0.0, (ts_ms - first_ms) / 1000.0 / self.speed)


@dataclass
class Selection:
    """Which records a replay copies.

    Runtime samples are copied only for a job's first phase, until the source brain's
    first ScalePlan for it: after that, the target env's own plans decide what the job
    does, and its metrics come from the target's operator (the simulator).
    """

    types: tuple[str, ...] = DEFAULT_TYPES
    first_phase_only: bool = True
    first_plan_at: dict[str, datetime] = field(default_factory=dict)

    def observe(self, event: Event) -> None:
        """Learn from records that are read but not copied (the source's ScalePlans)."""
        if isinstance(event, ScalePlan):
            self.first_plan_at.setdefault(event.job.uuid, event.occurred_at)

    def wants(self, event: Event) -> bool:
        if isinstance(event, Barrier | BarrierAck):
            # The source's ticks: the target's own operator and brain keep their own, and
            # a copied barrier would end a tick of the target that its operator never ran.
            return False
        if not any(fnmatch.fnmatchcase(event.type, pattern) for pattern in self.types):
            return False
        if self.first_phase_only and isinstance(event, RuntimeSample):
            first_plan = self.first_plan_at.get(event.job.uuid)
            return first_plan is None or event.occurred_at < first_plan
        return True


def source_steps(samples: Iterable[Event]) -> dict[str, int]:
    """Per job, the largest global step its samples reached (the rest is ignored)."""
    steps: dict[str, int] = {}
    for event in samples:
        if isinstance(event, RuntimeSample):
            key = event.job.uuid
            steps[key] = max(steps.get(key, 0), event.global_step)
    return steps


def with_source_steps(event: Event, steps: Mapping[str, int]) -> Event:
    """A submission with its job's steps in the source (SOURCE_STEPS), unless it states
    its length itself or the source has no sample of it; any other event as it is."""
    if not isinstance(event, JobSubmitted) or "total_steps" in event.config:
        return event
    reached = steps.get(event.job.uuid)
    if not reached:
        return event
    return event.model_copy(update={"config": {**event.config, SOURCE_STEPS: reached}})


def retarget(event: Event, env: str) -> Event:
    """The same event for another env.

    The event_id is kept: ids derived from inputs (plan ids) then agree across the envs
    fed the same replay, which is what makes arms comparable and re-runs idempotent.
    """
    return event if event.env == env else event.model_copy(update={"env": env})
