"""The bounded buffer of events waiting for the broker, and what it had to drop.

A job that runs for days through a broker outage must not run out of memory for our sake,
so the buffer has a size; when it is full the oldest runtime sample goes first (the brain
wants the newest state, and an OOM event is worth more than a sample), and every drop is
counted and logged (again at most every ``DROP_LOG_EVERY_S``): nothing is lost silently.
Owned by the reporter's thread.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from time import perf_counter

from schemas.envelope import Event
from schemas.jobs import RuntimeSample

log = logging.getLogger("dlrover_events.sdk.reporter")

#: How often a drop is logged again while the bus stays away.
DROP_LOG_EVERY_S = 30.0


class DropBuffer:
    """Events in the order they are to be sent; at most ``capacity`` of them."""

    def __init__(self, capacity: int, job: str, last_error: Callable[[], str | None]) -> None:
        if capacity < 1:
            raise ValueError("buffer_size must be >= 1")
        self.capacity = capacity
        self._job = job
        self._last_error = last_error
        self._events: deque[Event] = deque()
        #: events ever added (a requeue is not counted again).
        self.queued = 0
        #: events pushed out of the full buffer or discarded at close.
        self.dropped = 0
        #: the part of ``dropped`` since the current outage began.
        self.dropped_in_outage = 0
        self._logged_at: float | None = None

    def __len__(self) -> int:
        return len(self._events)

    def add(self, event: Event) -> None:
        self._events.append(event)
        self.queued += 1
        self._trim()

    def take(self, n: int) -> list[Event]:
        """Up to ``n`` events from the front, for one batch."""
        events = self._events
        return [events.popleft() for _ in range(min(n, len(events)))]

    def requeue(self, events: Sequence[Event]) -> None:
        """Put unacknowledged events back in front, in their order; the bound still holds."""
        if events:
            self._events.extendleft(reversed(events))
            self._trim()

    def discard(self, why: str) -> int:
        """Drop (and count) everything left: the reporter is closing."""
        left = len(self._events)
        if left:
            self._events.clear()
            self.drop(left, why)
        return left

    def outage_started(self) -> None:
        self.dropped_in_outage = 0

    def _trim(self) -> None:
        over = len(self._events) - self.capacity
        for _ in range(over):
            # The oldest runtime sample goes first; other events only when none is left.
            victim = next(
                (i for i, e in enumerate(self._events) if isinstance(e, RuntimeSample)), 0
            )
            del self._events[victim]
        if over > 0:
            self.drop(over, f"buffer of {self.capacity} events full")

    def drop(self, count: int, why: str) -> None:
        self.dropped += count
        self.dropped_in_outage += count
        now = perf_counter()
        if self._logged_at is None or now - self._logged_at >= DROP_LOG_EVERY_S:
            self._logged_at = now
            log.warning(
                "dlrover-events: dropped %d events so far for job %s (%s; last error: %s)",
                self.dropped,
                self._job,
                why,
                self._last_error(),
            )
