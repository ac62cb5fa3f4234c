"""Publishing events to the bus: a producer keyed by job, so one job's events stay in
order on their partition, with the ways tools, dead letters and lockstep markers need to
send (raw bytes, to every partition, queued without waiting)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaProducer

from dlrover_events.bus.kafka_client import kafka_connection, start_kafka_client
from dlrover_events.bus.topics import topic_of
from dlrover_events.lifecycle import AsyncResource
from dlrover_events.settings import Settings
from schemas.codec import encode
from schemas.envelope import Event


class Producer(AsyncResource):
    """Publishes events to their env topic, keyed so one job's events stay in order."""

    def __init__(self, settings: Settings, *, linger_ms: int = 5) -> None:
        self._settings = settings
        self._producer = AIOKafkaProducer(
            **kafka_connection(settings),
            client_id=settings.client_id,
            enable_idempotence=settings.enable_idempotence,
            transactional_id=settings.transactional_id,
            linger_ms=linger_ms,
            request_timeout_ms=settings.request_timeout_ms,
            acks="all",
        )

    async def start(self) -> None:
        await start_kafka_client(self._producer, self._settings)

    async def stop(self) -> None:
        await self._producer.stop()

    async def publish(self, event: Event) -> None:
        """Publish and wait until the broker has it."""
        await self.send_raw(topic_of(event), encode(event), event_key(event))

    async def publish_many(self, events: Iterable[Event]) -> int:
        """Publish a batch, letting the client pipeline it; returns once all are acked."""
        futures = [
            await self._producer.send(topic_of(e), encode(e), key=event_key(e)) for e in events
        ]
        if futures:
            await asyncio.gather(*futures)
        return len(futures)

    async def partitions(self, topic_name: str) -> list[int]:
        """The partitions of a full topic name, as the broker knows them now."""
        return sorted(await self._producer.partitions_for(topic_name))

    async def publish_to_partitions(
        self, event: Event, topic_name: str, partitions: Iterable[int] | None = None
    ) -> int:
        """Publish one event, with no key, to the given partitions of a full topic name
        (by default to every one of them).

        A marker that each reader must meet on each partition it reads (a lockstep barrier)
        cannot be keyed to one partition; returns how many partitions got it.
        """
        value = encode(event)
        parts = await self.partitions(topic_name) if partitions is None else list(partitions)
        futures = [await self._producer.send(topic_name, value, partition=p) for p in parts]
        if futures:
            await asyncio.gather(*futures)
        return len(futures)

    async def enqueue(
        self, topic_name: str, value: bytes | None, key: bytes | None, partition: int | None = None
    ) -> asyncio.Future[Any]:
        """Queue without waiting for the ack (the returned future has it, with the record's
        partition and offset); pair with flush(). ``partition``: that one, not the key's."""
        future: asyncio.Future[Any] = await self._producer.send(
            topic_name, value, key=key, partition=partition
        )
        return future

    async def send_raw(self, topic_name: str, value: bytes | None, key: bytes | None) -> None:
        """Bytes as they are: for dead letters, replays and tests of bad input."""
        await self._producer.send_and_wait(topic_name, value, key=key)

    async def flush(self) -> None:
        await self._producer.flush()


def event_key(event: Event) -> bytes | None:
    return event.key.encode() if event.key is not None else None
