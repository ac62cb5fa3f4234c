"""The event bus on aiokafka: a producer keyed by job, and a consumer that dead-letters
what it cannot decode and commits only after the handler's effects are durable.

Delivery is at least once. Handlers make their effects idempotent (event ids, plan ids),
so a consumer killed before its commit re-processes without duplicating anything.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from aiokafka.errors import (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)

from dlrover_events.errors import BusUnavailable
from dlrover_events.kafka_client import kafka_connection, start_kafka_client, topic_partitions
from dlrover_events.lifecycle import AsyncResource
from dlrover_events.settings import Settings
from dlrover_events.topic_reader import read_topics
from dlrover_events.topics import DLQ, topic, topic_of
from schemas.codec import CodecError, decode, encode
from schemas.dlq import DeadLetter, FailureKind, fitting_letter
from schemas.envelope import Event

log = logging.getLogger(__name__)


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
        await self.send_raw(topic_of(event), encode(event), _key(event))

    async def publish_many(self, events: Iterable[Event]) -> int:
        """Publish a batch, letting the client pipeline it; returns once all are acked."""
        futures = [await self._producer.send(topic_of(e), encode(e), key=_key(e)) for e in events]
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
        self, topic_name: str, value: bytes | None, key: bytes | None
    ) -> asyncio.Future[Any]:
        """Queue without waiting for the ack (the returned future has it); pair with flush()."""
        future: asyncio.Future[Any] = await self._producer.send(topic_name, value, key=key)
        return future

    async def send_raw(self, topic_name: str, value: bytes | None, key: bytes | None) -> None:
        """Bytes as they are: for dead letters, replays and tests of bad input."""
        await self._producer.send_and_wait(topic_name, value, key=key)

    async def flush(self) -> None:
        await self._producer.flush()


def _key(event: Event) -> bytes | None:
    return event.key.encode() if event.key is not None else None


@dataclass(frozen=True, slots=True)
class Received:
    """A decoded event with the coordinates it was read from."""

    event: Event
    topic: str
    partition: int
    offset: int
    timestamp_ms: int


Handler = Callable[[list[Received]], Awaitable[None]]


def dead_letter(
    env: str, record: ConsumerRecord, kind: FailureKind, error: str, group: str
) -> DeadLetter:
    """A dead letter of ``record`` that any producer can send: whatever the record holds,
    the letter fits an event's bound (`schemas.dlq.fitting_letter`)."""
    return fitting_letter(
        env=env,
        original_topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        value=record.value,
        kind=kind,
        error=error,
        group=group,
    )


def log_dead_letters(letters: Iterable[DeadLetter]) -> None:
    """One warning per dead letter, saying where the record was and why it failed."""
    for letter in letters:
        log.warning(
            "dead-lettered %s[%d]@%d%s: %s",
            letter.original_topic,
            letter.partition,
            letter.offset,
            f" ({letter.original_size} bytes, kept truncated)" if letter.truncated else "",
            letter.error,
        )


#: The broker (or the client) refuses the record for what it is: sending it again as it
#: is cannot succeed, whatever the broker's state.
_REFUSED = (MessageSizeTooLargeError, RecordTooLargeError, RecordListTooLargeError)


def _where(letter: DeadLetter) -> str:
    return f"{letter.original_topic}[{letter.partition}]@{letter.offset}"


async def send_dead_letters(
    producer: Producer, letters: Sequence[DeadLetter], *, max_backoff_s: float = 5.0
) -> int:
    """Publish dead letters and return how many the broker acked.

    A letter the broker refuses for its size is sent again without the original bytes
    (the reason and the coordinates are what matter), and one refused even so is logged
    and skipped: a consumer must never stop for good on a letter. Any other failure (the
    broker away) is retried with a backoff, each time saying why, because the offsets
    must not be committed past a record whose letter is not on the bus."""
    todo = list(letters)
    sent = attempt = 0
    while todo:
        attempt += 1
        results = await asyncio.gather(
            *(producer.send_raw(topic_of(x), encode(x), _key(x)) for x in todo),
            return_exceptions=True,
        )
        again: list[DeadLetter] = []
        transient = False
        for letter, result in zip(todo, results, strict=True):
            if not isinstance(result, BaseException):
                sent += 1
            elif isinstance(result, asyncio.CancelledError):
                raise result
            elif isinstance(result, _REFUSED) and letter.original_value is not None:
                log.warning(
                    "dead letter of %s refused (%s: %s); sending it without the original bytes",
                    _where(letter),
                    type(result).__name__,
                    result,
                )
                again.append(
                    letter.model_copy(
                        update={"original_value": None, "original_key": None, "truncated": True}
                    )
                )
            elif isinstance(result, _REFUSED):
                log.error(
                    "could not dead-letter %s (%s: %s); skipped it. Its reason: %s",
                    _where(letter),
                    type(result).__name__,
                    result,
                    letter.error,
                )
            else:
                transient = True
                again.append(letter)
                log.warning(
                    "dead letter of %s not sent (%s: %s); retrying (attempt %d)",
                    _where(letter),
                    type(result).__name__,
                    result,
                    attempt,
                )
        if transient:
            await asyncio.sleep(min(0.2 * attempt, max_backoff_s))
        todo = again
    return sent


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
        handler: Handler,
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
        self._backoff = retry_backoff_s
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
        await self._consumer.stop()
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
        await self._consumer.commit(offsets)
        return len(records)

    async def _process(self, records: list[ConsumerRecord]) -> None:
        good: list[Received] = []
        letters: list[DeadLetter] = []
        for r in records:
            try:
                event = decode(r.value)
            except CodecError as err:
                letters.append(dead_letter(self.env, r, err.kind, err.message, self.group))
                continue
            if event.env != self.env:
                msg = f"event of env {event.env!r} on topic {r.topic!r} of env {self.env!r}"
                letters.append(dead_letter(self.env, r, FailureKind.WRONG_ENV, msg, self.group))
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
                await asyncio.sleep(self._backoff * attempt)
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


async def read_topic(
    settings: Settings,
    topic_name: str,
    *,
    timeout_s: float = 10.0,
    expect: int | None = None,
    **consumer_args: Any,
) -> list[ConsumerRecord]:
    """A whole topic from the beginning, without a group (tools and tests): until
    ``expect`` records, or the end (see `dlrover_events.topic_reader`)."""
    return await read_topics(
        settings, [topic_name], timeout_s=timeout_s, expect=expect, **consumer_args
    )


__all__ = [
    "DLQ",
    "Consumer",
    "Handler",
    "Producer",
    "Received",
    "dead_letter",
    "read_topic",
    "send_dead_letters",
    "start_kafka_client",
    "topic_partitions",
]
