"""The order in which the brain decides its input: a function of the data, not of fetching.

What the brain decides for a job depends on how the job's `job.metrics`, `job.events` and
`scale.results` interleave. A consumer hands records over in batches that hold one
partition after another, and where a batch ends depends on timing: a backlog read after a
restart is cut differently from the same records read live, and so were the plans. Here
the assigned input partitions are merged into one sequence instead: the partition heads
compete by event time (then topic, partition, offset), and each partition keeps its own
order.

A record leaves the merge only when every assigned partition either has a record buffered
or has been read to its high watermark (Kafka Streams' rule): otherwise a record that is
already in the log but not yet fetched could belong before it. With every partition read
to its end, the order is that of the greedy merge of the partitions, whatever the fetch
batches were, and a restart that resumes from a checkpoint (a prefix of that order)
continues it exactly. Two bounds keep one partition from holding the others for ever, as
`max.task.idle.ms` does: a partition that lags without delivering for `max_idle_s`, and a
buffer grown past `max_buffered` records, let the others go on; `forced` counts the
records released so, the only ones whose order timing may change.

Pure: the caller says where its consumer stands (`Fetch`) and what time it is.
"""

from __future__ import annotations

import heapq
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Protocol, TypeVar

#: (topic, partition)
TP = tuple[str, int]


class Positioned(Protocol):
    """What the merge needs of a record besides its event time."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...


R = TypeVar("R", bound=Positioned)


@dataclass(frozen=True, slots=True)
class Fetch:
    """Where the consumer stands on one partition: the next offset it hands over, and the
    log's end as its last fetch saw it (None: not known yet)."""

    position: int | None
    highwater: int | None

    @property
    def caught_up(self) -> bool:
        return (
            self.position is not None
            and self.highwater is not None
            and self.position >= self.highwater
        )


_UNKNOWN = Fetch(None, None)

_OCCURRED_AT = re.compile(rb'"occurred_at"\s*:\s*"([^"]{1,64})"')
_COMPACT = b'"occurred_at":"'


def event_time(value: bytes | None) -> float:
    """The envelope's `occurred_at` as POSIX seconds, read without decoding the event (the
    processor decodes it once, after the merge). Anything without a readable one (it will
    be dead-lettered) sorts first: its place changes no decision."""
    if not value:
        return float("-inf")
    start = value.find(_COMPACT)  # as this project's encoder writes it: no regex needed
    if start >= 0:
        start += len(_COMPACT)
        end = value.find(b'"', start, start + 65)
        if end < 0:
            return float("-inf")
        text = value[start:end]
    else:
        found = _OCCURRED_AT.search(value)
        if found is None:
            return float("-inf")
        text = found.group(1)
    try:
        at = datetime.fromisoformat(text.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return float("-inf")
    if at.tzinfo is None:
        return float("-inf")  # the contract refuses a naive time: a dead letter
    return at.timestamp()


class Merge(Generic[R]):
    """Buffers the assigned partitions' records and releases them in merge order."""

    def __init__(
        self,
        time_of: Callable[[R], float],
        *,
        max_idle_s: float = 5.0,
        max_buffered: int = 100_000,
    ) -> None:
        self._time_of = time_of
        self.max_idle_s = max_idle_s
        self.max_buffered = max_buffered
        self._assigned: frozenset[TP] = frozenset()
        #: per partition: (event time, when it was added, record)
        self._buffers: dict[TP, deque[tuple[float, float, R]]] = {}
        self._size = 0
        #: since when each lagging partition with nothing buffered has held the others
        self._waiting_since: dict[TP, float] = {}
        #: records released before a lagging partition delivered (bounds above)
        self.forced = 0
        #: the partitions that held the others past `max_idle_s` at the last release
        self.stalled: frozenset[TP] = frozenset()
        #: when the oldest record of the last release was added (None: none released)
        self.released_since: float | None = None

    @property
    def assigned(self) -> frozenset[TP]:
        return self._assigned

    @property
    def buffered(self) -> int:
        return self._size

    def buffered_of(self, tp: TP) -> int:
        return len(self._buffers.get(tp, ()))

    def assign(self, partitions: Iterable[TP]) -> int:
        """The partitions to merge from now on; returns how many buffered records of the
        others were dropped (never released: whoever reads those partitions next reads
        them again from the checkpoint)."""
        assigned = frozenset(partitions)
        if assigned == self._assigned:
            return 0
        dropped = 0
        for tp in [tp for tp in self._buffers if tp not in assigned]:
            dropped += len(self._buffers.pop(tp))
        self._size -= dropped
        self._waiting_since = {tp: t for tp, t in self._waiting_since.items() if tp in assigned}
        self._assigned = assigned
        return dropped

    def add(self, records: Iterable[R], now: float = 0.0) -> None:
        """Records as fetched (each partition's in offset order); those of partitions not
        assigned are ignored. `now`: when they were fetched (for `released_since`)."""
        for record in records:
            tp = (record.topic, record.partition)
            if tp not in self._assigned:
                continue
            buffer = self._buffers.get(tp)
            if buffer is None:
                buffer = self._buffers[tp] = deque()
            buffer.append((self._time_of(record), now, record))
            self._size += 1

    def release(self, fetch: Mapping[TP, Fetch], now: float) -> list[R]:
        """Every record that may go, in merge order. `fetch`: where the consumer stands on
        each assigned partition (missing: nothing known); `now`: seconds, any clock."""
        waiting: set[TP] = set()
        for tp in self._assigned:
            if self._buffers.get(tp) or fetch.get(tp, _UNKNOWN).caught_up:
                self._waiting_since.pop(tp, None)
            else:
                waiting.add(tp)
                self._waiting_since.setdefault(tp, now)
        stalled = {tp for tp in waiting if now - self._waiting_since[tp] >= self.max_idle_s}
        self.stalled = frozenset(stalled)
        holding = waiting - stalled
        heads = [
            (buffer[0][0], tp[0], tp[1], buffer[0][2].offset)
            for tp, buffer in self._buffers.items()
            if buffer
        ]
        heapq.heapify(heads)
        out: list[R] = []
        since: float | None = None
        while heads:
            if holding:
                if self._size <= self.max_buffered:
                    break
                self.forced += 1
            _, topic, partition, _ = heapq.heappop(heads)
            tp = (topic, partition)
            buffer = self._buffers[tp]
            _, added, record = buffer.popleft()
            out.append(record)
            since = added if since is None or added < since else since
            self._size -= 1
            if buffer:
                heapq.heappush(heads, (buffer[0][0], topic, partition, buffer[0][2].offset))
            elif not fetch.get(tp, _UNKNOWN).caught_up:
                # its next record is not fetched yet and may belong before the others
                holding.add(tp)
                self._waiting_since[tp] = now
        self.released_since = since
        return out
