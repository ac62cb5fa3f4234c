"""Keeps a GatewayState from ``<env>.config.changes``, from the beginning, then live.

Group-less on purpose (like the tailer): every gateway instance must see every change,
and none may move another's offsets. The state is ready once the end offsets captured at
start are reached, so a fresh instance never answers from a half-built index.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from dlrover_events.errors import BusUnavailable, UserError
from dlrover_events.settings import Settings
from dlrover_events.topics import CONFIG_CHANGES, topic
from handlers.gateway.state import GatewayState
from schemas.codec import CodecError, decode
from schemas.config import ConfigChange

log = logging.getLogger(__name__)


def read_change(env: str, record: ConsumerRecord) -> ConfigChange | tuple[str, None] | str:
    """A change, a tombstone ``(name, None)``, or why the record is not usable."""
    if record.value is None:
        if record.key is None:
            return "tombstone without a key"
        return (record.key.decode("utf-8", "replace"), None)
    try:
        event = decode(record.value)
    except CodecError as err:
        return str(err)
    if not isinstance(event, ConfigChange):
        return f"a {event.type} event on the config topic"
    if event.env != env:
        return f"a change of env {event.env!r} on env {env!r}'s topic"
    return event


class Follower:
    def __init__(self, settings: Settings, state: GatewayState, *, poll_ms: int = 100) -> None:
        self.state = state
        self.topic = topic(state.env, CONFIG_CHANGES)
        self._settings = settings
        self._poll_ms = poll_ms
        self.rejected = 0
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            client_id=f"{settings.client_id}-gateway",
            request_timeout_ms=settings.request_timeout_ms,
            # A change should reach long-polls in well under a second.
            fetch_max_wait_ms=self._poll_ms,
        )
        self._end: dict[TopicPartition, int] = {}

    async def start(self) -> None:
        try:
            await self._consumer.start()
        except KafkaError as err:
            await self._consumer.stop()
            raise BusUnavailable(
                f"cannot reach Kafka at {self._settings.bootstrap_servers} ({err}); "
                "is the stack up?"
            ) from None
        await self._consumer._client.force_metadata_update()
        ids = self._consumer.partitions_for_topic(self.topic)
        if not ids:
            await self._consumer.stop()
            raise UserError(
                f"topic {self.topic} does not exist; is env {self.state.env!r} created? "
                "(`dlrover-events env list`)"
            )
        parts = [TopicPartition(self.topic, p) for p in sorted(ids)]
        self._consumer.assign(parts)
        await self._consumer.seek_to_beginning(*parts)
        self._end = await self._consumer.end_offsets(parts)
        await self._check_caught_up()

    async def stop(self) -> None:
        await self._consumer.stop()

    async def poll(self) -> int:
        """Apply one fetch; returns how many records it held."""
        batch = await self._consumer.getmany(timeout_ms=self._poll_ms)
        records = [r for rs in batch.values() for r in rs]
        changes: list[ConfigChange | tuple[str, None]] = []
        for r in records:
            got = read_change(self.state.env, r)
            if isinstance(got, str):
                self.rejected += 1
                log.warning("ignored %s[%d]@%d: %s", r.topic, r.partition, r.offset, got)
            else:
                changes.append(got)
        if changes:
            self.state.apply(changes)
        if not self.state.ready.is_set():
            await self._check_caught_up()
        return len(records)

    async def run(self, stop: asyncio.Event) -> None:
        """Follow until ``stop``; a broker outage is logged and retried, never fatal."""
        backoff = 0.2
        while not stop.is_set():
            try:
                await self.poll()
                backoff = 0.2
            except KafkaError as err:
                log.warning("config feed: %s; retrying in %.1fs", err, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _check_caught_up(self) -> None:
        for tp, end in self._end.items():
            if await self._consumer.position(tp) < end:
                return
        self.state.ready.set()
