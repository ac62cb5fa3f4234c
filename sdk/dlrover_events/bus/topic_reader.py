"""Reading topics without a consumer group: the one way the project does it.

Tools, recoveries and followers that must never move a service's committed offsets
(`tail`, the compacted followers, the control follower, the brain's recovery of what it
published, tests) read this way: every partition of the named topics assigned,
positioned (the beginning, the end, a time, or given offsets), then read to the end or
followed.

tansu answers a partition's end (ListOffsets) with the base offset + 1 of the batch it
wrote last by its clock: a lower bound, far below the true end when many batches share a
millisecond (1 for 620 records). So "read to the end" means past the end offsets captured
when the reader was positioned AND a fetch that brought nothing; and whether a log still
holds an offset is asked of its records (`short_of`), never of that end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from dlrover_events.bus.kafka_client import (
    kafka_connection,
    start_kafka_client,
    stop_consumer,
    topic_partitions,
)
from dlrover_events.errors import UserError
from dlrover_events.lifecycle import AsyncResource
from dlrover_events.settings import Settings

#: Where a reader starts: the beginning, the end, the first record at or after a time
#: (the end where none is), or an offset per partition (the beginning where none is given).
Start = Literal["earliest", "latest"] | datetime | Mapping[TopicPartition, int]


async def seek_to_time(
    consumer: AIOKafkaConsumer, parts: Sequence[TopicPartition], when: datetime
) -> None:
    """The first record at or after `when` on each partition; the end where there is none
    (a time past everything reads only what comes next). Any consumer, grouped or not."""
    ts = int(when.timestamp() * 1000)
    found = await consumer.offsets_for_times({tp: ts for tp in parts})
    past = [tp for tp, off in found.items() if off is None]
    for tp, off in found.items():
        if off is not None:
            consumer.seek(tp, off.offset)
    if past:
        await consumer.seek_to_end(*past)


class TopicReader(AsyncResource):
    """A group-less reader of whole topics. `start` assigns every partition of `topics`
    and positions them at `begin`; a topic that does not exist is a user error saying
    what to check (`missing`), unless `require` is off (then it is read as empty)."""

    def __init__(
        self,
        settings: Settings,
        topics: Sequence[str],
        *,
        client_id: str,
        begin: Start = "earliest",
        require: bool = True,
        missing: str = "",
        **consumer_args: Any,
    ) -> None:
        self.topics = list(topics)
        self.partitions: list[TopicPartition] = []
        self._settings = settings
        self._begin = begin
        self._require = require
        self._missing = missing
        consumer_args.setdefault("request_timeout_ms", settings.request_timeout_ms)
        self.consumer = AIOKafkaConsumer(
            **kafka_connection(settings),
            group_id=None,
            enable_auto_commit=False,
            client_id=f"{settings.client_id}-{client_id}",
            **consumer_args,
        )
        #: end offsets when the reader was positioned: "caught up" means past them
        self.end_hint: dict[TopicPartition, int] = {}

    async def start(self) -> None:
        await start_kafka_client(self.consumer, self._settings)
        try:
            await self.refresh()
            if self.partitions:
                await self.seek(self._begin)
        except BaseException:
            await stop_consumer(self.consumer)
            raise

    async def stop(self) -> None:
        await stop_consumer(self.consumer)

    async def refresh(self) -> list[TopicPartition]:
        """Assign every partition the broker now knows of `topics` (a topic created after
        `start`, say); the partitions already assigned keep their positions."""
        parts: list[TopicPartition] = []
        for name in self.topics:
            found = await topic_partitions(self.consumer, name)
            if not found and self._require:
                hint = f"; {self._missing}" if self._missing else ""
                raise UserError(f"topic {name} does not exist{hint}")
            parts.extend(found)
        if parts != self.partitions:
            self.consumer.assign(parts)
            self.partitions = parts
        return parts

    async def seek(self, start: Start) -> None:
        """Position every partition (see `Start`) and capture the end offsets."""
        parts = self.partitions
        if not parts:
            return
        if start == "earliest":
            await self.consumer.seek_to_beginning(*parts)
        elif start == "latest":
            await self.consumer.seek_to_end(*parts)
        elif isinstance(start, datetime):
            await seek_to_time(self.consumer, parts, start)
        else:
            assert isinstance(start, Mapping)
            fresh = [tp for tp in parts if tp not in start]
            for tp in parts:
                if tp in start:
                    self.consumer.seek(tp, start[tp])
            if fresh:
                await self.consumer.seek_to_beginning(*fresh)
        self.end_hint = await self.consumer.end_offsets(parts)

    async def fetch(
        self, timeout_ms: int = 300, max_records: int | None = None
    ) -> list[ConsumerRecord]:
        """One fetch over every assigned partition, each partition's records in order."""
        batch = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        return [record for records in batch.values() for record in records]

    async def short_of(
        self, offsets: Mapping[TopicPartition, int], *, timeout_s: float = 10.0
    ) -> dict[TopicPartition, int]:
        """The partitions whose log ends before the offset given for it, each with its end.

        Asked of the log itself: a record at the offset before the given one (or later)
        says the log reaches it; a fetch there that brings none and answers a high
        watermark below the offset says it does not (Kafka answers such a fetch "out of
        range", and the consumer's reset to the end then fetches the same answer). The
        other partitions are paused meanwhile; every partition asked about is left
        positioned somewhere in between. TimeoutError if the broker does not say."""
        asked = {tp: offset for tp, offset in offsets.items() if offset > 0}
        unknown = set(asked) - set(self.partitions)
        if unknown:
            raise ValueError(f"not assigned to this reader: {sorted(unknown)}")
        if not asked:
            return {}
        others = [tp for tp in self.partitions if tp not in asked]
        self.consumer.pause(*others)
        short: dict[TopicPartition, int] = {}
        try:
            for tp, offset in asked.items():
                self.consumer.seek(tp, offset - 1)
            pending = dict(asked)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while pending:
                if loop.time() > deadline:
                    where = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(pending))
                    raise TimeoutError(f"the broker did not say where {where} end")
                batch = await self.consumer.getmany(*pending, timeout_ms=300)
                for tp, records in batch.items():
                    if tp in pending and any(r.offset >= pending[tp] - 1 for r in records):
                        del pending[tp]
                for tp in list(pending):
                    highwater = self.consumer.highwater(tp)
                    if highwater is not None and highwater < pending[tp]:
                        short[tp] = highwater
                        del pending[tp]
        finally:
            self.consumer.resume(*others)
        return short

    async def caught_up(self) -> bool:
        """Whether every partition is past the end offsets captured when positioned."""
        for tp, end in self.end_hint.items():
            if await self.consumer.position(tp) < end:
                return False
        return True

    async def read_to_end(
        self, *, timeout_s: float = 10.0, expect: int | None = None
    ) -> list[ConsumerRecord]:
        """Everything from the position to the end (or `expect` records), in partition
        then offset order; at most `timeout_s` of waiting."""
        out: list[ConsumerRecord] = []
        if not self.partitions:
            return out
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if expect is not None and len(out) >= expect:
                break
            records = await self.fetch()
            out.extend(records)
            if not records and expect is None and await self.caught_up():
                break
        out.sort(key=lambda r: (r.topic, r.partition, r.offset))
        return out


async def read_topics(
    settings: Settings,
    topics: Sequence[str],
    *,
    client_id: str = "reader",
    begin: Start = "earliest",
    timeout_s: float = 10.0,
    expect: int | None = None,
    **consumer_args: Any,
) -> list[ConsumerRecord]:
    """What `topics` hold from `begin` to their end (a missing topic reads as empty)."""
    async with TopicReader(
        settings, topics, client_id=client_id, begin=begin, require=False, **consumer_args
    ) as reader:
        return await reader.read_to_end(timeout_s=timeout_s, expect=expect)


__all__ = ["Start", "TopicReader", "read_topics", "seek_to_time"]


async def read_topic(
    settings: Settings,
    topic_name: str,
    *,
    timeout_s: float = 10.0,
    expect: int | None = None,
    **consumer_args: Any,
) -> list[ConsumerRecord]:
    """A whole topic from the beginning, without a group (tools and tests): until
    ``expect`` records, or the end (see `read_topics`)."""
    return await read_topics(
        settings, [topic_name], timeout_s=timeout_s, expect=expect, **consumer_args
    )
