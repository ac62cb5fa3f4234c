"""Records sent together, in one batch, through `up`'s broker journal
(dlrover_events/runtime/broker_journal.py), on real tansu brokers and a real Postgres: each
comes back from a refill at its offset, readable from there, and the refilled log's end is
answered as its true end.

Why: tansu 0.6 answers ListOffsets (latest) with the base offset of a log's last batch + 1
(records 0-8, the last four in one batch: end 6), a lower bound. The chaos test of the
stack (issue 37) saw scale.plans[0]'s end answered as 8 with records up to 10 and a stalled
operator; this says the journal neither skips nor loses records of a batch (it copies by
fetch positions, refills from its rows, sends a log's last record alone), so the stall was
not there."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from dlrover_events.bus.kafka_client import stop_consumer
from dlrover_events.runtime.broker_journal import BrokerJournal
from dlrover_events.runtime.embedded import Broker
from tests.conftest import ARTIFACTS, journal_topic

pytestmark = pytest.mark.integration

TOPIC = "b.acks"
TP = TopicPartition(TOPIC, 0)
#: records sent together: one alone, three in a batch, one alone, four in a batch
GROUPS = [1, 3, 1, 4]


async def send_in_batches(servers: str) -> list[tuple[int, bytes]]:
    producer = AIOKafkaProducer(bootstrap_servers=servers, acks="all", linger_ms=100)
    await producer.start()
    try:
        acked: list[tuple[int, bytes]] = []
        n = 0
        for size in GROUPS:
            values = [f"r{n + i}".encode() for i in range(size)]
            n += size
            futures = [await producer.send(TOPIC, v, partition=0) for v in values]
            acked += [((await f).offset, v) for f, v in zip(futures, values, strict=True)]
        return acked
    finally:
        await producer.stop()


async def read_from(servers: str, start: int) -> tuple[list[tuple[int, bytes]], int]:
    """The records from ``start`` to the last one (until a fetch brings nothing), and the
    end the broker answers to ListOffsets."""
    consumer = AIOKafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TP])
        listed = (await consumer.end_offsets([TP]))[TP]
        consumer.seek(TP, start)
        seen: list[tuple[int, bytes]] = []
        while batch := await consumer.getmany(TP, timeout_ms=1000):
            seen += [(r.offset, r.value or b"") for r in batch[TP]]
        return seen, listed
    finally:
        await stop_consumer(consumer)


async def test_records_sent_in_one_batch_come_back_at_their_offsets(
    journal: BrokerJournal,
) -> None:
    first = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs")
    first.start()
    servers = first.bootstrap_servers
    try:
        await journal_topic(journal, servers, TOPIC, 1)
        acked = await send_in_batches(servers)
        assert [o for o, _ in acked] == list(range(sum(GROUPS)))
        before, listed = await read_from(servers, 0)
        assert before == acked
        print(f"\ntansu's end of {sum(GROUPS)} records, the last {GROUPS[-1]} in a batch: {listed}")
        assert await journal.drain()  # copied by fetch positions, whatever end is answered
    finally:
        first.stop()

    second = Broker("127.0.0.1", port=first.port, log_dir=ARTIFACTS / "logs")
    second.start()
    try:
        await journal.attach(servers)
        assert (await journal.refill()).records == sum(GROUPS)
        for start in range(sum(GROUPS) + 1):  # readable from any offset, a batch's middle too
            after, listed = await read_from(servers, start)
            assert after == acked[start:]
        assert listed == sum(GROUPS)  # the refilled log's end answered as its true end
    finally:
        second.stop()
