"""What a producer published that `up`'s broker journal has not copied yet, and, once the
broker was refilled, what the broker lost of it: to publish again, at the offsets it had.

`up`'s embedded broker acknowledges a record from memory and its journal copies it about
0.2 s later (`dlrover_events.runtime.broker_journal`): a broker that dies in between comes
back, refilled, without it (the journal's window, docs/operations.md). Its offset is then
taken by the next record written there, while every consumer that read the lost record
keeps its offset as read: a lockstep virtual operator skipped the brain's next BarrierAck
as one it had read, the brain skipped the operator's next tick, and both waited for good
(issue 37's chaos test). Rewinding every consumer is not enough either: the operator waits
for an acknowledgement the brain will not send again unless it decides again.

So a producer that must not lose what the broker told it is written (the lockstep operator,
the brain) notes each record with its offset; before it publishes more, and now and then
while it waits, it asks `lost`: the records noted before the broker's last refill that the
journal had not copied. Published again first, in order, into partitions only it writes
(a tick's events and barriers, plans and acknowledgements), they land where they were:
the log is as it was, and what every consumer read of it stays true. While the journal
refills the broker, `lost` cannot say (`answered` is False): a producer that publishes then
may land after the refill at a lost record's offset, so it waits (the brain's courier).

What this cannot mend: a record that straddled the refill (acknowledged by the new broker
before the journal copied it) is published twice; a partition another producer wrote into
after the refill, before this one published its lost records again, has them after the
other's. Without a journal of its broker (a Kafka cluster, memory storage) nothing is kept.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import murmur2

from dlrover_events.bus.kafka_client import kafka_connection, start_kafka_client, stop_consumer
from dlrover_events.runtime.broker_journal import journal_view
from dlrover_events.settings import Settings

#: Records kept at most while the journal does not say it copied them (a journal that does
#: not answer must not make a producer grow without bound): the oldest go first.
MAX_NOTED = 50_000
#: Seconds between two looks for a journal of a broker that had none.
REASK_S = 10.0
#: Seconds, at most, to read what a refilled broker has of what was noted (then asked again).
READ_TIMEOUT_S = 15.0
#: Seconds, at most, that a journal which had an owner and has none (its `up` gone) leaves
#: `lost` unanswered: an `up` comes back in well under this; one that does not, or comes
#: back without a journal (memory storage), must not hold its producers for ever.
OWNER_BACK_S = 180.0


@dataclass(frozen=True, slots=True)
class Sent:
    """One record the broker acknowledged: where, and what, to publish it again."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    #: the journal's refills when it was noted (-1: not known yet)
    refills: int = -1


class Unjournaled:
    """The records one producer published that the journal of its broker has not copied."""

    def __init__(self, db: asyncpg.Connection | asyncpg.Pool, settings: Settings) -> None:
        self._db = db
        self._settings = settings
        self._noted: deque[Sent] = deque()
        #: the journal's refills when last asked (None: never asked, or no journal then)
        self._refills: int | None = None
        #: whether a journal of this broker was found when last asked (None: not asked)
        self._journaled: bool | None = None
        self._asked = 0.0
        #: since when the journal, owned before, has had no owner (None: owned, or never)
        self._unowned_since: float | None = None
        self.republished = 0
        #: whether the last `lost` could say what the broker lost: not while the journal
        #: refills the broker, nor while a journal owned before has no owner (its `up`
        #: restarts, with a new broker to refill). A record published then lands before or
        #: after the refill: after, it takes the offset of a lost record that consumers
        #: read already, and they skip it (issue 37's chaos test: the operator waited for
        #: good for a BarrierAck the brain had published, the brain idle past its tick)
        self.answered = True

    def __len__(self) -> int:
        return len(self._noted)

    @property
    def keeps(self) -> bool:
        """Whether `note` keeps anything: False once no journal of the broker was found
        (until `lost` finds one again), so a producer may skip noting a batch."""
        return self._journaled is not False

    def note(
        self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None
    ) -> None:
        """A record the broker acknowledged at ``offset``."""
        if self._journaled is False:
            return  # no journal when last asked: nothing to keep
        refills = -1 if self._refills is None else self._refills
        self._noted.append(Sent(topic, partition, offset, key, value, refills))
        if len(self._noted) > MAX_NOTED:
            self._noted.popleft()

    async def lost(self) -> list[Sent]:
        """The records noted that the broker lost: acknowledged before its last refill and
        not in the journal it was refilled from, in the order they were published. They
        are forgotten here: publish them again (and note them again) before anything else.
        Records the journal copied are forgotten too. Empty while the broker is refilled or
        no `up` owns its journal (asked again at the next call).

        Ask before each publication: what is noted next is stamped with the refills seen
        here (a record stamped before a refill it came after would be taken for lost). A
        failure (Postgres, or the broker away while the log is read) changes nothing here:
        ask again before publishing anything, or the next records take the lost ones'
        offsets."""
        now = time.monotonic()
        if self._journaled is False and now - self._asked < REASK_S:
            return []
        self._asked = now
        topics = {s.topic for s in self._noted}
        view = await journal_view(self._db, self._settings.bootstrap_servers, topics)
        self.answered = False
        if view is None:
            if not self._journaled:
                # no journal of this broker: a Kafka cluster or memory storage (or an `up`
                # that restarts, whose broker lost everything anyway)
                self._journaled = False
                self._noted.clear()
                self.answered = True
                return []
            # journaled before: its `up` restarts (asked again next time)
            if self._unowned_since is None:
                self._unowned_since = now
            self.answered = now - self._unowned_since >= OWNER_BACK_S
            return []
        self._unowned_since = None
        self._journaled = True
        if view.refilling:
            return []
        refills = view.refills
        kept: deque[Sent] = deque()
        # acknowledged before the broker's last refill and not in the journal it was
        # refilled from; or by the new broker before the refill's end was seen here
        # (published while `up` restarted); or by a broker whose refill failed, at any
        # offset (one it gave a topic a client made): the log says which, by value
        gone = [s for s in self._noted if s.refills < refills]
        there, partitions = await self._in_log(gone) if gone else (set(), {})
        lost: list[Sent] = []
        for sent in self._noted:
            copied = view.copied.get((sent.topic, sent.partition), 0)
            if sent.refills >= refills:
                if sent.offset >= copied:
                    kept.append(sent)  # not copied yet
            elif (sent.topic, sent.partition, sent.value) in there:
                if sent.offset >= copied:
                    kept.append(Sent(*_where(sent), sent.key, sent.value, refills))
            elif (moved := _in_partitions(sent, partitions.get(sent.topic))) is not None:
                lost.append(moved)
        self._noted, self._refills = kept, refills
        self.republished += len(lost)
        self.answered = True
        return lost

    async def _in_log(
        self, sent: list[Sent]
    ) -> tuple[set[tuple[str, int, bytes | None]], dict[str, int]]:
        """The records of ``sent``'s partitions from the lowest offset noted of each (a
        record kept since it was acknowledged is near the log's end), and how many
        partitions each of their topics has now.

        A partition the refilled topic lacks is not read (asking its end waited 40 s, 30
        times: a stall of the chaos test of the stack): a record acknowledged by a broker
        whose refill failed may be in a topic a client made there (tansu makes one with 4
        partitions where the journal's has 3)."""
        starts: dict[TopicPartition, int] = {}
        for s in sent:
            tp = TopicPartition(s.topic, s.partition)
            starts[tp] = min(starts.get(tp, s.offset), s.offset)
        consumer = AIOKafkaConsumer(
            **kafka_connection(self._settings),
            client_id="unjournaled",
            enable_auto_commit=False,
            isolation_level="read_uncommitted",
            fetch_max_wait_ms=50,
        )
        await start_kafka_client(consumer, self._settings)
        found: set[tuple[str, int, bytes | None]] = set()
        partitions: dict[str, int] = {}
        try:
            await consumer.topics()  # (the metadata of every topic; makes none)
            for topic in {tp.topic for tp in starts}:
                partitions[topic] = len(consumer.partitions_for_topic(topic) or ())
            tps = sorted(tp for tp in starts if tp.partition < partitions[tp.topic])
            if not tps:
                return found, partitions
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, starts[tp])
            # tansu answers a log's end as a lower bound (the base offset of its last batch
            # + 1): read at least to it, then until a fetch brings nothing
            ends = await consumer.end_offsets(tps)
            async with asyncio.timeout(READ_TIMEOUT_S):
                while True:
                    batch = await consumer.getmany(timeout_ms=500)
                    for tp, records in batch.items():
                        found.update((tp.topic, tp.partition, r.value) for r in records)
                    if not batch and all([await consumer.position(tp) >= ends[tp] for tp in tps]):
                        break
        finally:
            await stop_consumer(consumer)
        return found, partitions

    def forget(self) -> None:
        """Nothing noted is to be published again (a producer that starts over)."""
        self._noted.clear()


def _where(sent: Sent) -> tuple[str, int, int]:
    return sent.topic, sent.partition, sent.offset


def _in_partitions(sent: Sent, partitions: int | None) -> Sent | None:
    """A lost record, to publish again where the refilled log has room for it: at its
    partition if the topic has it (or is not there: asked no more); else, keyed, where
    the producer's partitioner puts its key among the topic's partitions now, and unkeyed
    (a barrier sent to each partition of a topic a client made) nowhere: no consumer reads
    a partition the topic does not have."""
    if not partitions or sent.partition < partitions:
        return sent
    if sent.key is None:
        return None
    partition = (murmur2(sent.key) & 0x7FFFFFFF) % partitions
    return Sent(sent.topic, partition, -1, sent.key, sent.value, sent.refills)


__all__ = ["MAX_NOTED", "Sent", "Unjournaled"]
