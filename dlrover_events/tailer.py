"""The I/O half of `tail`: a group-less consumer over chosen env topics.

Group-less on purpose: tailing must never move a service's committed offsets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Literal

from aiokafka import AIOKafkaConsumer, TopicPartition

from dlrover_events.bus import start_kafka_client, topic_partitions
from dlrover_events.errors import UserError
from dlrover_events.settings import Settings
from dlrover_events.tail import Filter, Line, read_line
from dlrover_events.topics import ENV_TOPIC_NAMES, topic

Start = Literal["latest", "earliest"] | datetime


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
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        client_id=f"{settings.client_id}-tail",
    )
    await start_kafka_client(consumer, settings)
    emitted = 0
    try:
        parts: list[TopicPartition] = []
        for name in names:
            found = await topic_partitions(consumer, name)
            if not found:
                raise UserError(
                    f"topic {name} does not exist; is env {env!r} created? "
                    "(`dlrover-events env list`)"
                )
            parts.extend(found)
        consumer.assign(parts)
        await _seek(consumer, parts, start)
        if ready is not None:
            ready.set()
        while stop is None or not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200)
            for tp, records in batch.items():
                for r in records:
                    line = read_line(tp.topic, tp.partition, r.offset, r.value)
                    if line.event is not None and not where.accepts(line.event):
                        continue
                    if line.event is None and (where.job or where.type_pattern):
                        continue
                    emit(line)
                    emitted += 1
                    if max_events is not None and emitted >= max_events:
                        return emitted
    finally:
        await consumer.stop()
    return emitted


async def _seek(consumer: AIOKafkaConsumer, parts: list[TopicPartition], start: Start) -> None:
    if start == "earliest":
        await consumer.seek_to_beginning(*parts)
    elif start == "latest":
        await consumer.seek_to_end(*parts)
    else:
        assert isinstance(start, datetime)
        ts = int(start.timestamp() * 1000)
        found = await consumer.offsets_for_times({tp: ts for tp in parts})
        past = [tp for tp, off in found.items() if off is None]
        for tp, off in found.items():
            if off is not None:
                consumer.seek(tp, off.offset)
        if past:
            await consumer.seek_to_end(*past)
