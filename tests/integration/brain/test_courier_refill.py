"""The brain's courier beside a broker its journal is refilling (streams/brain/runtime/
courier.py, dlrover_events/runtime/unjournaled.py), on real tansu brokers and a real
Postgres: a batch decided while the journal refills the broker waits for the refill, so
the acknowledgements the broker lost go back first, at their offsets, and the batch lands
after them. Before, `lost` answered "nothing" while the journal was refilling, the batch
went out at once and took the offset of a lost acknowledgement that the lockstep operator
had read: the operator skipped it and waited for good for its tick's ack, the brain idle
past that tick (issue 37's chaos test of the stack, 5 runs of 11)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client import CollectorRegistry

from dlrover_events.bus.kafka_client import stop_consumer
from dlrover_events.runtime.broker_journal import BrokerJournal, RefillError
from dlrover_events.runtime.embedded import Broker
from dlrover_events.runtime.metrics import BrainMetrics
from dlrover_events.runtime.unjournaled import Unjournaled
from dlrover_events.settings import Settings
from schemas.codec import decode
from schemas.lockstep import BarrierAck
from streams.brain.core.processor import Output
from streams.brain.runtime.courier import Courier
from tests.conftest import ARTIFACTS, journal_topic

pytestmark = pytest.mark.integration

ENV = "cr"
PLANS = f"{ENV}.scale.plans"
DEADLINE_S = 60.0


def acks(*ticks: int) -> Output:
    at = datetime(2026, 3, 1, tzinfo=UTC)
    out = Output()
    out.acks.extend(
        BarrierAck(env=ENV, occurred_at=at, source="b", tick=t, sim_at=at) for t in ticks
    )
    return out


def ticks(value: bytes) -> int:
    event = decode(value)
    assert isinstance(event, BarrierAck)
    return event.tick


async def the_log(servers: str) -> list[tuple[int, bytes]]:
    """(offset, value) of every record of the plans' partition, read to its last record
    (tansu answers a log's end as a lower bound: read until a fetch brings nothing)."""
    tp = TopicPartition(PLANS, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        seen: list[tuple[int, bytes]] = []
        while batch := await consumer.getmany(tp, timeout_ms=1000):
            seen += [(r.offset, r.value or b"") for r in batch[tp]]
        return seen
    finally:
        await stop_consumer(consumer)


async def test_a_batch_waits_for_the_refill_and_lands_after_what_the_broker_lost(
    journal: BrokerJournal, own_pg: str
) -> None:
    first = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs")
    first.start()
    servers = first.bootstrap_servers
    settings = Settings(bootstrap_servers=servers)
    pool = await asyncpg.create_pool(own_pg, min_size=1, max_size=2)
    producer = AIOKafkaProducer(bootstrap_servers=servers, acks="all", linger_ms=0)
    second: Broker | None = None
    courier: Courier | None = None

    async def send(name: str, key: bytes | None, value: bytes, partition: int | None) -> Any:
        return await (await producer.send(name, value, key=key, partition=partition))

    try:
        await journal_topic(journal, servers, PLANS, 1)
        assert await journal.drain()  # the topic in the journal, no record yet
        await producer.start()
        courier = Courier(
            settings, ENV, send, BrainMetrics(CollectorRegistry(), ENV), asyncio.Event()
        )
        courier.unjournaled = Unjournaled(pool, settings)
        courier._partitions[PLANS] = [0]  # (asked of the broker otherwise)
        await courier.start()
        await courier.put(acks(7, 8, 9), time.monotonic())
        await courier.published_all()
        before = await the_log(servers)
        assert [(o, ticks(v)) for o, v in before] == [(0, 7), (1, 8), (2, 9)]  # not copied
        first.stop()  # dies with the three acks

        second = Broker("127.0.0.1", port=first.port, log_dir=ARTIFACTS / "logs")
        await journal.say_restarting()  # (as `up` does before its new broker answers)
        second.start()
        await journal.attach(servers)
        # tick 10 decided while the journal refills the new broker
        await courier.put(acks(10), time.monotonic())
        deadline = time.monotonic() + DEADLINE_S
        while courier.unjournaled.answered and not await the_log(servers):
            assert time.monotonic() < deadline, "the courier neither waited nor published"
            await asyncio.sleep(0.05)
        try:
            await journal.refill()
        except RefillError as err:
            pytest.fail(f"the courier published into a broker being refilled: {err}")
        await asyncio.wait_for(courier.published_all(), DEADLINE_S)
        after = await the_log(servers)
        # the lost acks back at their offsets, then tick 10's: what the operator read of
        # the log stays true, and it reads tick 10's ack
        assert after[:3] == before
        assert [(o, ticks(v)) for o, v in after[3:]] == [(3, 10)]
    finally:
        if courier is not None:
            await courier.stop()
        await producer.stop()
        first.stop()
        if second is not None:
            second.stop()
        await pool.close()
