"""The embedded broker's journal (dlrover_events/runtime/broker_journal.py), on real tansu
brokers and a real Postgres: what one broker held comes back in a new one, at the same
offsets, with the topics' configs and the groups' commits."""

from __future__ import annotations

import asyncio
import uuid
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from dlrover_events.bus.kafka_client import stop_consumer
from dlrover_events.errors import UserError
from dlrover_events.runtime.broker_journal import (
    BrokerJournal,
    RefillError,
    database_identity,
    journal_view,
)
from dlrover_events.runtime.embedded import Broker, ensure_database
from dlrover_events.settings import Settings
from dlrover_events.store.database import quote_ident
from tests.conftest import ARTIFACTS, _admin

pytestmark = pytest.mark.integration


def new_broker() -> Broker:
    broker = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs")
    broker.start()
    return broker


async def fill(servers: str) -> None:
    """Two topics (one compacted, two partitions), keyed records with headers, and a
    group that committed part of one partition."""
    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    await admin.start()
    await admin.create_topics(
        [
            NewTopic("j.events", 2, 1, topic_configs={"retention.ms": "86400000"}),
            NewTopic("j.docs", 1, 1, topic_configs={"cleanup.policy": "compact"}),
        ]
    )
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=servers)
    await producer.start()
    for i in range(300):
        await producer.send(
            "j.events",
            f"e{i}".encode(),
            key=f"k{i % 7}".encode(),
            partition=i % 2,
            headers=[("n", str(i).encode())],
            timestamp_ms=1_700_000_000_000 + i,
        )
    for i in range(5):
        await producer.send("j.docs", f"v{i}".encode(), key=b"doc", partition=0)
    await producer.send_and_wait("j.docs", None, key=b"gone", partition=0)
    await producer.stop()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=servers, group_id="j-group", enable_auto_commit=False
    )
    await consumer.start()
    tp = TopicPartition("j.events", 0)
    consumer.assign([tp])
    await consumer.commit({tp: 120})
    await stop_consumer(consumer)


async def journal_filled(journal: BrokerJournal, servers: str) -> None:
    """A new broker filled, then journaled from its (empty) refill on: all of it drained."""
    await fill(servers)
    await journal.attach(servers)
    await journal.refill()
    assert await journal.drain()


async def read_all(servers: str, topic: str, partitions: int) -> list[tuple[object, ...]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
    await consumer.start()
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    ends = await consumer.end_offsets(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    seen: list[tuple[object, ...]] = []
    while len(seen) < sum(ends.values()):
        for tp, records in (await consumer.getmany(timeout_ms=1000)).items():
            seen += [
                (tp.partition, r.offset, r.timestamp, r.key, r.value, tuple(r.headers))
                for r in records
            ]
    await stop_consumer(consumer)
    return sorted(seen)


async def committed(servers: str, group: str, tp: TopicPartition) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=servers, group_id=group)
    await consumer.start()
    try:
        return await consumer.committed(tp)
    finally:
        await stop_consumer(consumer)


async def configs(servers: str, topic: str) -> dict[str, str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    await admin.start()
    try:
        (response,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic)]
        )
        return {e[0]: e[1] for e in response.resources[0][4]}
    finally:
        await admin.close()


async def test_a_new_broker_gets_the_records_offsets_configs_and_commits_back(
    journal: BrokerJournal,
) -> None:
    first = new_broker()
    try:
        await fill(first.bootstrap_servers)
        before = await read_all(first.bootstrap_servers, "j.events", 2)
        docs_before = await read_all(first.bootstrap_servers, "j.docs", 1)
        await journal.attach(first.bootstrap_servers)
        assert (await journal.refill()).topics == 0  # an empty journal: nothing to put back
        stop = asyncio.Event()
        copying = asyncio.create_task(journal.run(stop))
        await asyncio.sleep(1.5)  # copying as the broker runs
        stop.set()
        await copying
        assert await journal.drain()
    finally:
        first.stop()

    second = new_broker()
    try:
        await journal.attach(second.bootstrap_servers)
        refill = await journal.refill()
        assert (refill.topics, refill.records, refill.groups) == (2, 306, 1)
        assert await read_all(second.bootstrap_servers, "j.events", 2) == before
        assert await read_all(second.bootstrap_servers, "j.docs", 1) == docs_before
        assert (await configs(second.bootstrap_servers, "j.docs"))["cleanup.policy"] == "compact"
        tp = TopicPartition("j.events", 0)
        assert await committed(second.bootstrap_servers, "j-group", tp) == 120

        # It goes on from there: what the second broker gets is journaled after the rest.
        producer = AIOKafkaProducer(bootstrap_servers=second.bootstrap_servers)
        await producer.start()
        sent = await producer.send_and_wait("j.events", b"after", partition=1)
        await producer.stop()
        assert sent.offset == 150
        assert await journal.drain()
        rows = await journal._conn.fetch(
            'SELECT "offset", value FROM broker_records WHERE topic = $1 AND part = 1 '
            'ORDER BY "offset" DESC LIMIT 1',
            "j.events",
        )
        assert [(r["offset"], r["value"]) for r in rows] == [(150, b"after")]
    finally:
        second.stop()


async def test_a_deleted_topic_leaves_the_journal(journal: BrokerJournal) -> None:
    broker = new_broker()
    try:
        await journal_filled(journal, broker.bootstrap_servers)
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        await admin.start()
        await admin.delete_topics(["j.docs"])
        await admin.close()
        assert await journal.drain()
    finally:
        broker.stop()
    kept = await journal._conn.fetch("SELECT DISTINCT topic FROM broker_records")
    assert {r["topic"] for r in kept} == {"j.events"}
    assert [r["name"] for r in await journal._conn.fetch("SELECT name FROM broker_topics")] == [
        "j.events"
    ]


async def test_a_broker_not_refilled_is_not_followed_and_the_journal_keeps_all(
    journal: BrokerJournal,
) -> None:
    """A broker started again whose refill failed has no topics: draining it (as `up`
    does when it stops) must not take that for every topic deleted (seen in CI: a refill
    that raised, then `up`'s drain emptied the journal)."""
    first = new_broker()
    try:
        await journal_filled(journal, first.bootstrap_servers)
    finally:
        first.stop()
    second = new_broker()
    try:
        await journal.attach(second.bootstrap_servers)  # and no refill
        assert not await journal.drain()
        stop = asyncio.Event()
        copying = asyncio.create_task(journal.run(stop))
        await asyncio.sleep(1.5)
        stop.set()
        await copying
    finally:
        second.stop()
    topics = await journal._conn.fetch("SELECT name FROM broker_topics ORDER BY name")
    assert [r["name"] for r in topics] == ["j.docs", "j.events"]
    assert await journal._conn.fetchval("SELECT count(*) FROM broker_records") == 306


async def test_topics_a_client_made_before_the_refill_are_made_again_as_the_journal_says(
    journal: BrokerJournal,
) -> None:
    """A client that reconnects to a restarted broker before its refill makes the topics it
    asks about (tansu makes a topic a client asks about: four partitions, no config). Empty,
    they are made again with the journal's partitions and configs and refilled; before, the
    refill failed (RefillError) and `up` tried a new broker, which the clients could race
    again (issue 37: a 20-kill chaos run stalled on it). One a client wrote into still
    fails the refill: its offsets would shift."""
    first = new_broker()
    try:
        await journal_filled(journal, first.bootstrap_servers)
        events = await read_all(first.bootstrap_servers, "j.events", 2)
        docs = await read_all(first.bootstrap_servers, "j.docs", 1)
    finally:
        first.stop()
    second = new_broker()
    try:
        producer = AIOKafkaProducer(bootstrap_servers=second.bootstrap_servers)
        await producer.start()
        try:
            made = {n: await producer.partitions_for(n) for n in ("j.events", "j.docs")}
        finally:
            await producer.stop()
        # tansu made them as a client asked, with its own partitions (4), not the journal's
        assert {n: len(p) for n, p in made.items()} == {"j.events": 4, "j.docs": 4}
        await journal.attach(second.bootstrap_servers)
        refill = await journal.refill()
        assert (refill.topics, refill.records) == (2, 306)
        assert await read_all(second.bootstrap_servers, "j.events", 2) == events
        assert await read_all(second.bootstrap_servers, "j.docs", 1) == docs
        assert (await configs(second.bootstrap_servers, "j.docs"))["cleanup.policy"] == "compact"
    finally:
        second.stop()
    third = new_broker()
    try:
        producer = AIOKafkaProducer(bootstrap_servers=third.bootstrap_servers)
        await producer.start()
        try:
            await producer.send_and_wait("j.docs", b"early", key=b"doc")
        finally:
            await producer.stop()
        await journal.attach(third.bootstrap_servers)
        with pytest.raises(RefillError, match="written into by a client"):
            await journal.refill()
    finally:
        third.stop()


async def test_one_up_at_a_time_owns_a_journal(journal: BrokerJournal, own_pg: str) -> None:
    with pytest.raises(UserError, match="another `up` keeps its broker's records"):
        await BrokerJournal.open(Settings(), own_pg)


async def test_a_journal_database_that_cannot_be_made_is_one_line(pg_dsn: str) -> None:
    """A Postgres role without CREATEDB (an external server's): `up` says what to do."""
    role = f"dle_nocreate_{uuid.uuid4().hex[:8]}"
    await _admin(pg_dsn, f"CREATE ROLE {quote_ident(role)} LOGIN NOCREATEDB")
    try:
        parts = urlsplit(pg_dsn)
        as_role = urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))
        with pytest.raises(UserError, match="cannot create database dle_never_made"):
            await ensure_database(as_role, "dle_never_made")
    finally:
        await _admin(pg_dsn, f"DROP ROLE {quote_ident(role)}")


async def test_a_refill_leaves_a_group_with_live_members_to_them(journal: BrokerJournal) -> None:
    """A consumer of a group is connected when the broker comes back (a standalone brain
    reconnects within milliseconds): Kafka refuses a group-less commit for a group with
    members, and that refusal ended the refill and `up` with it (issue 37: `up` exited
    with a traceback, CommitFailedError). The refill leaves such a group to its members
    (who resume as they do without a commit) and commits the other groups'."""
    first = new_broker()
    try:
        await journal_filled(journal, first.bootstrap_servers)
        await committed_by(first.bootstrap_servers, "j-other", TopicPartition("j.events", 1), 7)
        assert await journal.drain()
    finally:
        first.stop()
    second = new_broker()
    admin = AIOKafkaAdminClient(bootstrap_servers=second.bootstrap_servers)
    await admin.start()
    await admin.create_topics([NewTopic("j.events", 2, 1)])  # as the refill makes it
    await admin.close()
    member = AIOKafkaConsumer(
        "j.events",
        bootstrap_servers=second.bootstrap_servers,
        group_id="j-group",
        enable_auto_commit=False,
        session_timeout_ms=10000,
        heartbeat_interval_ms=300,
    )
    await member.start()
    try:
        while not member.assignment():
            await member.getmany(timeout_ms=100)
        await journal.attach(second.bootstrap_servers)
        refill = await journal.refill()
        assert refill.records == 306
        assert (refill.groups, refill.left_to_members) == (1, ("j-group",))
        tp = TopicPartition("j.events", 1)
        assert await committed(second.bootstrap_servers, "j-other", tp) == 7
    finally:
        await stop_consumer(member)
        second.stop()


async def committed_by(servers: str, group: str, tp: TopicPartition, offset: int) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=servers, group_id=group)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.commit({tp: offset})
    finally:
        await stop_consumer(consumer)


async def test_a_journal_is_its_stacks_and_refuses_another_in_one_line(own_pg: str) -> None:
    """A second stack named the first one's journal database: before, it started with the
    first one's topics, records and group offsets (issue 37)."""
    first = await BrokerJournal.open(Settings(), own_pg, stack="database a (oid 1) on x:5432")
    await first.close()
    with pytest.raises(UserError, match=r"is the stack of database a \(oid 1\) on x:5432's"):
        await BrokerJournal.open(Settings(), own_pg, stack="database b (oid 2) on x:5432")
    again = await BrokerJournal.open(Settings(), own_pg, stack="database a (oid 1) on x:5432")
    await again.close()


async def test_by_default_a_journal_is_its_own_databases(
    journal: BrokerJournal, own_pg: str
) -> None:
    conn = await asyncpg.connect(own_pg)
    try:
        assert journal.stack == await database_identity(conn)
        assert await conn.fetchval("SELECT count(*) FROM broker_journal.stack") == 1
    finally:
        await conn.close()


async def test_a_broker_restarting_is_said_refilling_before_it_answers(
    journal: BrokerJournal, own_pg: str
) -> None:
    """`up` says so before the new broker starts: a reader (a standalone service's
    readiness, the brain) that asks between the broker's start and the refill must not
    find a broker that answers, empty, and not refilling (seen in a CI run: a service run
    alone said ready, not ready, then ready again after a kill -9 of tansu). No refill is
    counted until one begins."""
    first = new_broker()
    try:
        await journal_filled(journal, first.bootstrap_servers)
    finally:
        first.stop()
    servers = first.bootstrap_servers
    conn = await asyncpg.connect(own_pg)
    try:
        before = await journal_view(conn, servers, ())
        assert before is not None and not before.refilling
        await journal.say_restarting()
        held = await journal_view(conn, servers, ())
        assert held is not None and held.refilling and held.refills == before.refills
        second = Broker("127.0.0.1", first.port, log_dir=ARTIFACTS / "logs")
        second.start()
        try:
            await journal.attach(second.bootstrap_servers)
            still = await journal_view(conn, servers, ())
            assert still is not None and still.refilling  # the broker answers, not refilled
            await journal.refill()
        finally:
            second.stop()
        after = await journal_view(conn, servers, ())
        assert after is not None and not after.refilling and after.refills == before.refills + 1
    finally:
        await conn.close()
