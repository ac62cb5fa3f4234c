"""The I/O half of replay: read the source env's input topics, write the target env's.

Resumable: the read position is committed to the consumer group ``<target>.replay.<source>``
only after what was copied up to it is acked by the broker (commit after effect), so a
stopped replay resumes where it stopped without losing or (beyond the last uncommitted
second) repeating records.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from dlrover_events.bus.kafka_client import (
    kafka_connection,
    start_kafka_client,
    stop_consumer,
    topic_partitions,
)
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import TopicReader, seek_to_time
from dlrover_events.bus.topics import JOB_EVENTS, JOB_METRICS, SCALE_PLANS, split_topic, topic
from dlrover_events.errors import UserError
from dlrover_events.settings import Settings
from schemas.codec import CodecError, decode, encode
from schemas.envelope import Event
from streams.replay.core import (
    Pacer,
    Recorded,
    Selection,
    TimeMerge,
    retarget,
    source_steps,
    with_source_steps,
)

log = logging.getLogger(__name__)

#: Copied topics, and the source's plans that are read only to find each job's first phase.
COPIED = (JOB_EVENTS, JOB_METRICS)
OBSERVED = (SCALE_PLANS,)

CopyProgress = Callable[[int, int], None]  # (records handled so far, total in range)


@dataclass
class ReplayReport:
    read: int = 0
    copied: int = 0
    skipped: int = 0
    undecodable: int = 0
    per_topic: dict[str, int] = field(default_factory=dict)


@dataclass
class Replay:
    settings: Settings
    source: str
    target: str
    pacer: Pacer = field(default_factory=lambda: Pacer(None))
    selection: Selection = field(default_factory=Selection)
    since: datetime | None = None
    until: datetime | None = None
    follow: bool = False
    restart: bool = False
    max_records: int | None = None  # stop after this many read (tests, sampling)
    commit_every_s: float = 1.0

    @property
    def group(self) -> str:
        return f"{self.target}.replay.{self.source}"

    async def run(
        self, progress: CopyProgress | None = None, stop: asyncio.Event | None = None
    ) -> ReplayReport:
        if self.source == self.target:
            raise UserError("replay needs two different envs (--from and --to are the same)")
        consumer = AIOKafkaConsumer(
            **kafka_connection(self.settings),
            group_id=self.group,
            enable_auto_commit=False,
            client_id=f"{self.settings.client_id}-replay",
        )
        await start_kafka_client(consumer, self.settings)
        report = ReplayReport()
        try:
            async with Producer(self.settings) as producer:
                cutoff_ms = int(time.time() * 1000)
                if self.until is not None:
                    cutoff_ms = min(cutoff_ms, int(self.until.timestamp() * 1000))
                parts = await self._assign(consumer)
                end_hint: dict[TopicPartition, int] = await consumer.end_offsets(parts)
                start = {tp: await consumer.position(tp) for tp in parts}
                total = sum(max(0, end_hint[tp] - start[tp]) for tp in parts)
                steps = await self._source_steps(cutoff_ms)
                copier = _Copier(self, consumer, producer, report, steps)
                await copier.bounded(parts, end_hint, cutoff_ms, total, progress, stop)
                if self.follow and not (stop and stop.is_set()) and not copier.limit_reached:
                    await copier.live(parts, stop)
                await copier.checkpoint()
        finally:
            await stop_consumer(consumer)
        return report

    async def _source_steps(self, cutoff_ms: int) -> dict[str, int]:
        """Per job, the last global step its samples reached in the source, up to the
        cutoff: a copied submission carries it (core.SOURCE_STEPS), since the first phase
        the replay copies does not say how long the job trained."""
        steps: dict[str, int] = {}
        async with TopicReader(
            self.settings,
            [topic(self.source, JOB_METRICS)],
            client_id="replay-steps",
            begin=self.since or "earliest",
        ) as reader:
            while True:
                records = await reader.fetch()
                events = []
                for r in records:
                    if r.timestamp > cutoff_ms:
                        continue
                    try:
                        events.append(decode(r.value))
                    except CodecError:
                        continue
                for job, step in source_steps(events).items():
                    steps[job] = max(steps.get(job, 0), step)
                if not records and await reader.caught_up():
                    return steps

    async def _assign(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        parts: list[TopicPartition] = []
        for name in (*COPIED, *OBSERVED):
            for env in (self.source, self.target):
                if not await topic_partitions(consumer, topic(env, name)):
                    raise UserError(
                        f"topic {topic(env, name)} does not exist; is env {env!r} created?"
                    )
            parts.extend(await topic_partitions(consumer, topic(self.source, name)))
        consumer.assign(parts)
        committed = {} if self.restart else {tp: await consumer.committed(tp) for tp in parts}
        fresh = [tp for tp in parts if committed.get(tp) is None]
        for tp, offset in committed.items():
            if offset is not None:
                consumer.seek(tp, offset)
        if fresh and self.since is not None:
            await seek_to_time(consumer, fresh, self.since)
        elif fresh:
            await consumer.seek_to_beginning(*fresh)
        return parts


class _Copier:
    """State of one run: what is read, copied, and safe to commit."""

    def __init__(
        self,
        replay: Replay,
        consumer: AIOKafkaConsumer,
        producer: Producer,
        report: ReplayReport,
        steps: dict[str, int],
    ) -> None:
        self.r = replay
        self.steps = steps
        self.consumer = consumer
        self.producer = producer
        self.report = report
        self.next_offset: dict[TopicPartition, int] = {}
        self.loop = asyncio.get_running_loop()
        self.last_commit = self.loop.time()
        self.first_ms: int | None = None
        self.wall0 = 0.0

    @property
    def limit_reached(self) -> bool:
        return self.r.max_records is not None and self.report.read >= self.r.max_records

    async def bounded(
        self,
        parts: Sequence[TopicPartition],
        end_hint: dict[TopicPartition, int],
        cutoff_ms: int,
        total: int,
        progress: CopyProgress | None,
        stop: asyncio.Event | None,
    ) -> None:
        """Copy what existed when the replay started (or up to --until), in time order.

        A partition ends at the first record newer than ``cutoff_ms`` (put back for the
        live phase or the next run), or when a fetch past the broker's end offset brings
        nothing: tansu's end offsets lag by a batch, so they are only a lower bound.
        """
        merge: TimeMerge[TopicPartition] = TimeMerge(parts)
        while not merge.done and not self.limit_reached and not (stop and stop.is_set()):
            for tp in merge.needs():
                batch = await self.consumer.getmany(tp, timeout_ms=300, max_records=500)
                records = batch.get(tp, [])
                fresh = [r for r in records if r.timestamp <= cutoff_ms]
                if len(fresh) < len(records):
                    self.consumer.seek(tp, records[len(fresh)].offset)
                merge.add(tp, [_recorded(r) for r in fresh])
                if len(fresh) < len(records) or (
                    not records and await self.consumer.position(tp) >= end_hint[tp]
                ):
                    merge.close(tp)
            record = merge.pop()
            if record is None:
                continue
            await self._handle(record, pace=True)
            if progress is not None:
                progress(self.report.read, max(total, self.report.read))

    async def live(self, parts: Sequence[TopicPartition], stop: asyncio.Event | None) -> None:
        """Follow: copy new records as they arrive, in partition order."""
        while not (stop and stop.is_set()) and not self.limit_reached:
            batch = await self.consumer.getmany(*parts, timeout_ms=300)
            for records in batch.values():
                for r in records:
                    await self._handle(_recorded(r), pace=False)
            await self._maybe_checkpoint()

    async def _handle(self, rec: Recorded, *, pace: bool) -> None:
        report = self.report
        report.read += 1
        tp = TopicPartition(rec.topic, rec.partition)
        self.next_offset[tp] = rec.offset + 1
        _, name = split_topic(rec.topic)
        if name in OBSERVED:
            if rec.event is not None:
                self.r.selection.observe(rec.event)
            return
        copy_raw = rec.event is None and "*" in self.r.selection.types
        if rec.event is None:
            report.undecodable += 1
        if not copy_raw and (rec.event is None or not self.r.selection.wants(rec.event)):
            report.skipped += 1
            return
        if pace:
            await self._pace(rec.timestamp_ms)
        value = (
            rec.value
            if rec.event is None
            else encode(retarget(with_source_steps(rec.event, self.steps), self.r.target))
        )
        await self.producer.enqueue(topic(self.r.target, name), value, rec.key)
        report.copied += 1
        report.per_topic[name] = report.per_topic.get(name, 0) + 1
        await self._maybe_checkpoint()

    async def _pace(self, ts_ms: int) -> None:
        if self.first_ms is None:
            self.first_ms, self.wall0 = ts_ms, self.loop.time()
        delay = self.wall0 + self.r.pacer.due_s(self.first_ms, ts_ms) - self.loop.time()
        if delay > 0:
            await self.checkpoint()  # idle anyway: make the position durable first
            await asyncio.sleep(delay)

    async def _maybe_checkpoint(self) -> None:
        if self.loop.time() - self.last_commit >= self.r.commit_every_s:
            await self.checkpoint()

    async def checkpoint(self) -> None:
        """Flush what was copied, then commit the read position that covers it."""
        if not self.next_offset:
            return
        await self.producer.flush()
        await self.consumer.commit(dict(self.next_offset))
        self.last_commit = self.loop.time()


def _recorded(r: ConsumerRecord) -> Recorded:
    try:
        event: Event | None = decode(r.value)
    except CodecError:
        event = None
    return Recorded(r.topic, r.partition, r.offset, r.timestamp, r.key, event, r.value)
