"""What a producer published that the broker journal had not copied when the broker died
(dlrover_events/runtime/unjournaled.py), on real tansu brokers and a real Postgres: after
the refill it is said lost, and published again it lands at the offsets it had, so the log
is as every consumer read it (issue 37: a lockstep operator and its brain each skipped the
other's next record, which took the offset of a lost one, and waited for good)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

from dlrover_events.runtime.broker_journal import BrokerJournal
from dlrover_events.runtime.embedded import Broker
from dlrover_events.runtime.unjournaled import Unjournaled
from dlrover_events.settings import Settings
from tests.conftest import ARTIFACTS, journal_topic
from tests.integration.test_broker_journal import read_all

pytestmark = pytest.mark.integration

TOPIC = "u.acks"


async def send(servers: str, records: list[tuple[int, bytes]]) -> list[tuple[int, int, bytes]]:
    """(partition, value) each, in order: (partition, offset, value) as acknowledged."""
    producer = AIOKafkaProducer(bootstrap_servers=servers, acks="all", linger_ms=0)
    await producer.start()
    try:
        acked = []
        for partition, value in records:
            meta = await producer.send_and_wait(TOPIC, value, partition=partition)
            acked.append((partition, meta.offset, value))
        return acked
    finally:
        await producer.stop()


def untimed(records: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return [(p, o, k, v, h) for p, o, _, k, v, h in records]


async def test_what_a_refilled_broker_lost_is_published_again_at_its_offsets(
    journal: BrokerJournal, own_pg: str
) -> None:
    first = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs")
    first.start()
    servers = first.bootstrap_servers
    settings = Settings(bootstrap_servers=servers)
    conn = await asyncpg.connect(own_pg)
    unjournaled = Unjournaled(conn, settings)
    try:
        await journal_topic(journal, servers, TOPIC, 2)
        assert await unjournaled.lost() == []  # asked before publishing: refills known

        def note(acked: list[tuple[int, int, bytes]]) -> None:
            for partition, offset, value in acked:
                unjournaled.note(TOPIC, partition, offset, None, value)

        note(await send(servers, [(i % 2, f"kept{i}".encode()) for i in range(8)]))
        assert await journal.drain()  # journaled: these survive
        assert await unjournaled.lost() == []
        assert len(unjournaled) == 0  # what the journal has is not kept
        note(await send(servers, [(i % 2, f"lost{i}".encode()) for i in range(5)]))
        assert await unjournaled.lost() == []  # not copied yet: kept, not lost
        assert len(unjournaled) == 5
        before = await read_all(servers, TOPIC, 2)
    finally:
        first.stop()  # with 5 records the journal never copied

    second = Broker("127.0.0.1", port=first.port, log_dir=ARTIFACTS / "logs")
    second.start()
    try:
        await journal.attach(servers)
        assert (await journal.refill()).records == 8
        lost = await unjournaled.lost()
        assert [(s.partition, s.offset, s.value) for s in lost] == [
            (i % 2, 4 + i // 2, f"lost{i}".encode()) for i in range(5)
        ]
        again = await send(servers, [(s.partition, s.value or b"") for s in lost])
        assert [(p, o) for p, o, _ in again] == [(s.partition, s.offset) for s in lost]
        note(again)
        # the log as it was, but for the records' timestamps (the producer's clock)
        assert untimed(await read_all(servers, TOPIC, 2)) == untimed(before)
        # what the new broker got is not taken for lost, copied or not
        note(await send(servers, [(0, b"after")]))
        assert await unjournaled.lost() == []
        assert await journal.drain()
        assert await unjournaled.lost() == []
        assert len(unjournaled) == 0
    finally:
        second.stop()
        await conn.close()


async def test_a_record_in_a_partition_the_refilled_topic_lacks_is_lost_not_waited_for(
    journal: BrokerJournal, own_pg: str
) -> None:
    """A record acknowledged by a broker whose refill failed may sit in a topic a client
    made there (tansu: 4 partitions), at a partition the journal's topic lacks. Asking that
    partition's end waited 40 s, 30 times (the operator of the chaos test of the stack
    stalled so); it is lost: keyed, published again where its key goes now; unkeyed (a
    barrier to each partition), nowhere."""
    first = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs")
    first.start()
    servers = first.bootstrap_servers
    conn = await asyncpg.connect(own_pg)
    unjournaled = Unjournaled(conn, Settings(bootstrap_servers=servers))
    try:
        await journal_topic(journal, servers, TOPIC, 2)
        await send(servers, [(0, b"kept")])
        assert await journal.drain()
        assert await unjournaled.lost() == []
        unjournaled.note(TOPIC, 3, 0, b"job-7", b"event")
        unjournaled.note(TOPIC, 3, 1, None, b"barrier")
        unjournaled.note(TOPIC, 1, 0, b"job-8", b"other")
    finally:
        first.stop()
    second = Broker("127.0.0.1", port=first.port, log_dir=ARTIFACTS / "logs")
    second.start()
    try:
        await journal.attach(servers)
        assert (await journal.refill()).records == 1
        async with asyncio.timeout(30):
            lost = await unjournaled.lost()
        where = (murmur2(b"job-7") & 0x7FFFFFFF) % 2
        assert [(s.partition, s.key, s.value) for s in lost] == [
            (where, b"job-7", b"event"),
            (1, b"job-8", b"other"),
        ]
    finally:
        second.stop()
        await conn.close()


async def test_without_a_journal_nothing_is_kept(own_pg: str) -> None:
    broker = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs")
    broker.start()
    conn = await asyncpg.connect(own_pg)
    try:
        unjournaled = Unjournaled(conn, Settings(bootstrap_servers=broker.bootstrap_servers))
        assert await unjournaled.lost() == []
        unjournaled.note(TOPIC, 0, 0, None, b"x")
        assert len(unjournaled) == 0
    finally:
        broker.stop()
        await conn.close()
