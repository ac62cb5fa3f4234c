"""The bus on the real tansu broker and Postgres: round trip, order, isolation, DLQ."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson
import pytest

from dlrover_events.bus.consumer import Consumer, Received
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import DLQ, JOB_EVENTS, JOB_METRICS, topic
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from schemas import (
    JobMeta,
    JobStarted,
    NodeOOM,
    OOMKind,
    RuntimeSample,
    decode,
    encode,
)
from schemas.dlq import DeadLetter, FailureKind
from schemas.jobs import NodeRef
from tests.conftest import EnvFactory

pytestmark = pytest.mark.integration


def sample(env: str, job: str, step: int) -> RuntimeSample:
    return RuntimeSample(env=env, job=JobMeta(uuid=job), global_step=step, speed=1.0)


async def consume_until(
    settings: Settings,
    env: str,
    topics: Sequence[str],
    group: str,
    count: int,
    *,
    timeout_s: float = 20.0,
) -> tuple[list[Received], Consumer]:
    got: list[Received] = []

    async def handle(batch: list[Received]) -> None:
        got.extend(batch)

    consumer = Consumer(settings, env, topics, group, handle)
    async with consumer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(got) < count and loop.time() < deadline:
            await consumer.poll(timeout_ms=300)
    return got, consumer


async def test_events_round_trip_in_per_job_order(settings: Settings, make_env: EnvFactory) -> None:
    env = (await make_env()).name
    events = [sample(env, f"job-{j}", step) for step in range(40) for j in range(5)]
    async with Producer(settings) as producer:
        await producer.publish_many(events)
    got, _ = await consume_until(settings, env, [JOB_METRICS], "roundtrip", len(events))
    assert sorted(r.event.event_id for r in got) == sorted(e.event_id for e in events)
    assert {r.event.event_id: r.event for r in got} == {e.event_id: e for e in events}
    for j in range(5):
        steps = [r.event.global_step for r in got if r.event.key == f"job-{j}"]  # type: ignore[attr-defined]
        assert steps == list(range(40)), "one job's events stay in order"
    partitions = {r.event.key: set() for r in got}
    for r in got:
        partitions[r.event.key].add(r.partition)
    assert all(len(p) == 1 for p in partitions.values()), "one job, one partition"


async def test_two_envs_are_isolated(settings: Settings, pg_dsn: str, make_env: EnvFactory) -> None:
    a, b = (await make_env()).name, (await make_env()).name
    async with Producer(settings) as producer:
        await producer.publish_many([sample(a, "job-a", s) for s in range(20)])
    got_a, _ = await consume_until(settings, a, [JOB_METRICS, JOB_EVENTS], "brain", 20)
    got_b, consumer_b = await consume_until(
        settings, b, [JOB_METRICS, JOB_EVENTS], "brain", 1, timeout_s=3.0
    )
    assert len(got_a) == 20
    assert got_b == [] and consumer_b.group == f"{b}.brain"

    # Tables live in separate schemas: what env a archives is invisible from env b.
    store_a, store_b = await EnvStore.open(pg_dsn, a), await EnvStore.open(pg_dsn, b)
    async with store_a, store_b:
        assert await store_a.archive(got_a) == 20
        assert (await store_a.fetch("SELECT count(*) AS n FROM events_archive"))[0]["n"] == 20
        assert (await store_b.fetch("SELECT count(*) AS n FROM events_archive"))[0]["n"] == 0
        assert store_a.schema != store_b.schema


async def test_bad_messages_go_to_the_dlq_and_valid_ones_around_them_are_processed(
    settings: Settings, make_env: EnvFactory
) -> None:
    env = (await make_env(partitions=1)).name
    other = (await make_env()).name
    job = JobMeta(uuid="job-1")
    first = JobStarted(env=env, job=job)
    last = NodeOOM(env=env, job=job, node=NodeRef(type="worker", id=0), kind=OOMKind.HOST_MEMORY)
    valid_json = orjson.loads(encode(JobStarted(env=env, job=job)))
    bad: list[tuple[bytes, FailureKind]] = [
        (b"\x00\xffnot json", FailureKind.MALFORMED),
        (b"[1, 2, 3]", FailureKind.MALFORMED),
        (orjson.dumps({**valid_json, "type": "job.teleported"}), FailureKind.UNKNOWN_TYPE),
        (orjson.dumps({**valid_json, "job": {"uuid": ""}}), FailureKind.INVALID),
        (orjson.dumps({**valid_json, "schema_version": 99}), FailureKind.UNSUPPORTED_VERSION),
        (encode(JobStarted(env=other, job=job)), FailureKind.WRONG_ENV),
    ]
    events_topic = topic(env, JOB_EVENTS)
    async with Producer(settings) as producer:
        await producer.publish(first)
        for raw, _ in bad:
            await producer.send_raw(events_topic, raw, b"job-1")
        await producer.publish(last)

    got, consumer = await consume_until(settings, env, [JOB_EVENTS], "dlq-test", 2)
    assert [r.event.event_id for r in got] == [first.event_id, last.event_id]
    assert consumer.dead_lettered == len(bad)

    letters = [decode(r.value) for r in await read_topic(settings, topic(env, DLQ))]
    assert len(letters) == len(bad)
    for letter, (raw, kind) in zip(letters, bad, strict=True):
        assert isinstance(letter, DeadLetter)
        assert letter.error_kind == kind
        assert letter.error, "a dead letter says why"
        assert letter.value_bytes() == raw, "original bytes kept whole"
        assert letter.key_bytes() == b"job-1"
        assert letter.original_topic == events_topic
        assert letter.partition == 0
        assert letter.consumer_group == f"{env}.dlq-test"
    assert [letter.offset for letter in letters] == list(range(1, len(bad) + 1))


async def test_a_poison_event_is_dead_lettered_and_the_rest_processed(
    settings: Settings, make_env: EnvFactory
) -> None:
    env = (await make_env(partitions=1)).name
    events = [sample(env, "job-1", s) for s in range(5)]
    poison = events[2].event_id
    done: list[int] = []

    async def handle(batch: list[Received]) -> None:
        if any(r.event.event_id == poison for r in batch):
            raise RuntimeError("cannot process step 2")
        done.extend(r.event.global_step for r in batch)  # type: ignore[attr-defined]

    async with Producer(settings) as producer:
        await producer.publish_many(events)
    consumer = Consumer(
        settings, env, [JOB_METRICS], "poison", handle, handler_attempts=2, retry_backoff_s=0.01
    )
    async with consumer:
        for _ in range(20):
            await consumer.poll(timeout_ms=300)
            if consumer.dead_lettered:
                break
    assert sorted(done) == [0, 1, 3, 4]
    letters = [decode(r.value) for r in await read_topic(settings, topic(env, DLQ))]
    assert len(letters) == 1
    assert isinstance(letters[0], DeadLetter)
    assert letters[0].error_kind == FailureKind.HANDLER
    assert "cannot process step 2" in letters[0].error


async def test_an_event_published_to_every_partition_reaches_each_once(
    settings: Settings, make_env: EnvFactory
) -> None:
    """A marker for every reader of every partition (a lockstep barrier) carries no key,
    so the partitioner would put it on one partition only."""
    env = (await make_env(partitions=3)).name
    full = topic(env, JOB_EVENTS)
    marker = JobStarted(env=env, job=JobMeta(uuid="job-m"))
    async with Producer(settings) as producer:
        assert await producer.partitions(full) == [0, 1, 2]
        assert await producer.publish_to_partitions(marker, full) == 3
        assert await producer.publish_to_partitions(marker, full, [2]) == 1
    records = await read_topic(settings, full, expect=4)
    assert sorted(r.partition for r in records) == [0, 1, 2, 2]
    assert all(r.key is None and decode(r.value) == marker for r in records)
