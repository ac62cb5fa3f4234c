"""Consuming an env's topics in a consumer group: each batch decoded, what fails
dead-lettered, the valid events handed over, and the offsets committed only after the
handler's effects are durable and the letters acked.

Delivery is at least once. Handlers make their effects idempotent (event ids, plan ids),
so a consumer killed before its commit re-processes without duplicating anything.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, ConsumerRecord
from aiokafka.errors import CommitFailedError

from dlrover_events.backoff import Backoff
from dlrover_events.bus.dead_letters import dead_letter, log_dead_letters, send_dead_letters
from dlrover_events.bus.kafka_client import kafka_connection, start_kafka_client, stop_consumer
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import topic
from dlrover_events.errors import BusUnavailable
from dlrover_events.lifecycle import AsyncResource
from dlrover_events.settings import Settings
from schemas.codec import CodecError, check_env, decode
from schemas.dlq import DeadLetter, FailureKind
from schemas.envelope import Event

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Received:
    """A decoded event with the coordinates it was read from."""

    event: Event
    topic: str
    partition: int
    offset: int
    timestamp_ms: int


BatchHandler = Callable[[list[Received]], Awaitable[None]]


class Consumer(AsyncResource):
    """Consumes some of one env's topics in a consumer group of that env.

    Each fetched batch is decoded; what fails becomes a dead letter in ``<env>.dlq``; the
    valid events go to ``handler``; the offsets are committed only when both the dead
    letters are acked and the handler has returned. A handler that keeps failing is
    retried per event, and an event that still fails is dead-lettered (kind ``handler``)
    so one poison event cannot stall a partition forever.
    """

    def __init__(
        self,
        settings: Settings,
        env: str,
        topics: Sequence[str],
        group: str,
        handler: BatchHandler,
        *,
        from_beginning: bool = True,
        max_records: int | None = None,
        handler_attempts: int = 3,
        retry_backoff_s: float = 0.2,
        fetch_max_wait_ms: int = 500,
    ) -> None:
        self.env = env
        self.group = f"{env}.{group}"
        self._settings = settings
        self._topics = [topic(env, t) for t in topics]
        self._handler = handler
        self._max_records = max_records or settings.consumer_batch
        self._attempts = handler_attempts
        self._backoff = Backoff(initial_s=retry_backoff_s, max_s=max(retry_backoff_s, 5.0))
        self._consumer = AIOKafkaConsumer(
            *self._topics,
            **kafka_connection(settings),
            client_id=settings.client_id,
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest" if from_beginning else "latest",
            request_timeout_ms=settings.request_timeout_ms,
            session_timeout_ms=settings.session_timeout_ms,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            isolation_level="read_uncommitted",
            # tansu answers a fetch when this wait is over, not when data arrives: the
            # floor of the latency of a consumer that waits for an answer (lockstep).
            fetch_max_wait_ms=fetch_max_wait_ms,
        )
        self._producer = Producer(settings)
        self._stopping = asyncio.Event()
        self.processed = 0
        self.dead_lettered = 0
        #: dead letters by failure kind
        self.dead_letter_kinds: dict[str, int] = {}

    async def start(self) -> None:
        await self._producer.start()
        try:
            await start_kafka_client(self._consumer, self._settings)
        except BusUnavailable:
            await self._producer.stop()
            raise

    async def stop(self) -> None:
        self._stopping.set()
        await stop_consumer(self._consumer)
        await self._producer.stop()

    async def run(self) -> None:
        """Consume until ``stop()`` is called or the task is cancelled."""
        while not self._stopping.is_set():
            await self.poll(timeout_ms=500)

    async def poll(self, timeout_ms: int = 1000) -> int:
        """Fetch one batch, process and commit it; returns how many records it covered."""
        batch = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=self._max_records)
        if not batch:
            return 0
        records = [r for rs in batch.values() for r in rs]
        await self._process(records)
        offsets = {tp: rs[-1].offset + 1 for tp, rs in batch.items()}
        try:
            await self._consumer.commit(offsets)
        except CommitFailedError as err:
            # the group rebalanced under the batch (a broker restarted: a new coordinator,
            # a new generation): its effects are done and idempotent; whoever reads these
            # partitions next reads it again from the last commit. Ending the consumer
            # here ended a standalone operator (issue 37's chaos test)
            log.warning(
                "consumer %s: commit refused after a rebalance (%s); the batch will be read "
                "again from the last commit",
                self.group,
                err.args[-1] if err.args else err,
            )
        return len(records)

    async def _process(self, records: list[ConsumerRecord]) -> None:
        good: list[Received] = []
        letters: list[DeadLetter] = []
        for r in records:
            try:
                event = check_env(decode(r.value), self.env, r.topic)
            except CodecError as err:
                letters.append(dead_letter(self.env, r, err.kind, err.message, self.group))
                continue
            good.append(Received(event, r.topic, r.partition, r.offset, r.timestamp))
        if good:
            letters.extend(await self._handle(good, records))
        if letters:
            await send_dead_letters(self._producer, letters)
            self.dead_lettered += len(letters)
            for letter in letters:
                kind = letter.error_kind.value
                self.dead_letter_kinds[kind] = self.dead_letter_kinds.get(kind, 0) + 1
            log_dead_letters(letters)
        self.processed += len(good)

    async def _handle(
        self, good: list[Received], records: list[ConsumerRecord]
    ) -> list[DeadLetter]:
        for attempt in range(1, self._attempts + 1):
            try:
                await self._handler(good)
                return []
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("handler failed on a batch of %d (attempt %d)", len(good), attempt)
                await asyncio.sleep(self._backoff.delay(attempt))
        # The batch keeps failing: isolate the events that fail on their own.
        by_coord = {(r.topic, r.partition, r.offset): r for r in records}
        letters = []
        for item in good:
            try:
                await self._handler([item])
            except asyncio.CancelledError:
                raise
            except Exception as err:
                record = by_coord[(item.topic, item.partition, item.offset)]
                letters.append(
                    dead_letter(
                        self.env,
                        record,
                        FailureKind.HANDLER,
                        f"{type(err).__name__}: {err}",
                        self.group,
                    )
                )
        return letters
