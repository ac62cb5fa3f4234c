"""What the reconciler says, said once: node and job events, results, capacity reports
out on the env's topics through one producer, each fact at most once per operator run.

One role of the reconciler (handlers.operator.reconcile.reconciler), cut out: event ids are
derived from facts (events.py), so a look at a job that finds what an earlier look found
derives the same ids, and this remembers the last ``memory`` ids it published to say
nothing twice. A result is published whatever was said before (``dedupe=False``): a plan
delivered again is answered again.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Iterable

from dlrover_events.bus.producer import Producer
from schemas.envelope import Event

#: How many event ids are remembered as said.
SENT_MEMORY = 20000


class Outbox:
    """The reconciler's producer, and the ids of what it said lately."""

    def __init__(self, memory: int = SENT_MEMORY) -> None:
        self.memory = memory
        #: set for the run of the reconciler (None: not running, nothing can be said)
        self.producer: Producer | None = None
        self._sent: OrderedDict[uuid.UUID, None] = OrderedDict()

    async def publish(self, events: Iterable[Event], *, dedupe: bool = True) -> None:
        """Publish what was not said yet (``dedupe`` False: all of it)."""
        fresh = [e for e in events if not (dedupe and e.event_id in self._sent)]
        if not fresh:
            return
        assert self.producer is not None
        await self.producer.publish_many(fresh)
        for e in fresh:
            self._sent[e.event_id] = None
        while len(self._sent) > self.memory:
            self._sent.popitem(last=False)

    async def publish_one(self, event: Event) -> None:
        """One event, said whatever was said before (a capacity report, an answer)."""
        await self.publish([event], dedupe=False)


__all__ = ["SENT_MEMORY", "Outbox"]
