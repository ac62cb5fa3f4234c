"""The I/O half of `tail`: a group-less consumer over chosen env topics.

Group-less on purpose: tailing must never move a service's committed offsets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from dlrover_events.bus.tail import Filter, Line, read_line
from dlrover_events.bus.topic_reader import Start, TopicReader
from dlrover_events.bus.topics import ENV_TOPIC_NAMES, topic
from dlrover_events.settings import Settings


async def follow(
    settings: Settings,
    env: str,
    topics: Sequence[str],
    emit: Callable[[Line], None],
    *,
    where: Filter = Filter(),
    start: Start = "latest",
    max_events: int | None = None,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
) -> int:
    """Emit matching lines until ``max_events`` or ``stop``; returns how many were emitted."""
    names = [topic(env, t) for t in (topics or ENV_TOPIC_NAMES)]
    reader = TopicReader(
        settings,
        names,
        client_id="tail",
        begin=start,
        missing=f"is env {env!r} created? (`dlrover-events env list`)",
    )
    emitted = 0
    async with reader:
        if ready is not None:
            ready.set()
        while stop is None or not stop.is_set():
            for r in await reader.fetch(timeout_ms=200):
                line = read_line(r.topic, r.partition, r.offset, r.value)
                if line.event is not None and not where.accepts(line.event):
                    continue
                if line.event is None and (where.job or where.type_pattern):
                    continue
                emit(line)
                emitted += 1
                if max_events is not None and emitted >= max_events:
                    return emitted
    return emitted
