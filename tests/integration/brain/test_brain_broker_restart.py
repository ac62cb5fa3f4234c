"""A broker whose logs restarted empty (the embedded broker keeps topics in memory) under a
brain's Postgres checkpoint: the brain says so and decides the new records instead of
skipping every one below its old offsets."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import TopicReader
from dlrover_events.bus.topics import JOB_EVENTS, JOB_METRICS, SCALE_PLANS, topic
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.runtime.embedded import Broker
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from schemas import encode
from schemas.jobs import JobMeta
from streams.brain.runtime.app import Brain
from tests.conftest import ARTIFACTS, unique_env
from tests.integration.brain.workload import expected_plans, job_events, plans_on, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
async def own_broker() -> AsyncIterator[Broker]:
    """A broker of this test alone: restarting the session's would pull it from under
    every other test."""
    broker = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs")
    broker.start()
    yield broker
    broker.stop()


def _settings(broker: Broker, pg_dsn: str) -> Settings:
    return Settings(
        bootstrap_servers=broker.bootstrap_servers,
        pg_dsn=pg_dsn,
        partitions=1,
        request_timeout_ms=10000,
        session_timeout_ms=2000,
        heartbeat_interval_ms=300,
    )


async def _publish(settings: Settings, env: str, job: str, count: int) -> set[str]:
    """One job's events (all in the env's one partition); the ScalePlan ids they make."""
    events = job_events(env, JobMeta(uuid=job), count)
    async with Producer(settings) as producer:
        for event in events:
            assert event.key is not None
            await producer.send_raw(topic(env, JOB_EVENTS), encode(event), event.key.encode())
    _, scale = expected_plans(events)
    assert scale
    return scale


async def _decide(settings: Settings, env: str, pg_dsn: str, want: set[str]) -> None:
    brain = Brain(settings, env, pg_dsn, checkpoint_every_s=0.5)
    await brain.start()
    try:
        await wait_for(
            lambda: brain.processor.counters.scale_plans >= len(want),
            timeout_s=60,
            what=f"the brain to make the {len(want)} ScalePlans of the new records",
        )
    finally:
        await brain.stop()


async def test_a_brain_decides_what_a_restarted_broker_holds(
    own_broker: Broker, pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(own_broker, pg_dsn)
    registry = EnvRegistry(settings, pg_dsn)
    env = unique_env("br")
    await registry.create(env, partitions=1)
    try:
        # before: a long job, checkpointed far into the logs
        first = await _publish(settings, env, "job-before", 40)
        await _decide(settings, env, pg_dsn, first)
        async with await EnvStore.open(pg_dsn, env) as store:
            rows = await store.fetch("SELECT topic, next_offset FROM brain_offsets")
        held = {r["topic"]: r["next_offset"] for r in rows}
        assert held[topic(env, JOB_EVENTS)] > 20, held

        # the broker restarts empty, on the same port; its topics are made again
        own_broker.stop()
        own_broker.start()
        await registry.create(env, partitions=1, exist_ok=True)

        # after: a shorter job, every record below the offsets checkpointed before
        caplog.set_level(logging.WARNING, logger="streams.brain")
        second = await _publish(settings, env, "job-after", 12)
        await _decide(settings, env, pg_dsn, second)

        on_topic = {p.plan_id for p in await plans_on(settings, topic(env, SCALE_PLANS))}
        assert on_topic == second, "the restarted broker's records were not all decided"
        said = [r.getMessage() for r in caplog.records if "the log ends at" in r.getMessage()]
        assert any(topic(env, JOB_EVENTS) in m for m in said), said
        assert any(topic(env, SCALE_PLANS) in m for m in said), said  # outputs too
        async with await EnvStore.open(pg_dsn, env) as store:
            rows = await store.fetch("SELECT topic, next_offset FROM brain_offsets")
        now = {r["topic"]: r["next_offset"] for r in rows}
        # overwritten with where the new logs are, not kept as the greatest of the two
        assert now[topic(env, JOB_EVENTS)] == 2 + 12, now
        assert now[topic(env, SCALE_PLANS)] == len(second), now
    finally:
        with contextlib.suppress(Exception):
            await registry.delete(env, force=True)


async def test_a_caught_up_brain_restarted_on_the_same_broker_resumes_without_a_reset(
    own_broker: Broker, pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """tansu answers a log's end (ListOffsets) with the base offset + 1 of the batch written
    last by its clock, far below the true end when many batches share a millisecond: the
    checkpoint of a brain that read everything then lies "beyond the end". The record at
    the checkpointed offset is there all the same, so nothing restarted and nothing is
    read again, said or reset; the lag is nil."""
    settings = _settings(own_broker, pg_dsn)
    registry = EnvRegistry(settings, pg_dsn)
    env = unique_env("bk")
    await registry.create(env, partitions=1)
    samples_topic = topic(env, JOB_METRICS)
    try:
        events = job_events(env, JobMeta(uuid="job-long"), 600, oom_every=50)
        async with Producer(settings, linger_ms=0) as producer:
            await producer.publish_many(events)
        _, scale = expected_plans(events)
        await _decide(settings, env, pg_dsn, scale)
        async with await EnvStore.open(pg_dsn, env) as store:
            rows = await store.fetch("SELECT topic, next_offset FROM brain_offsets")
        held = {r["topic"]: r["next_offset"] for r in rows}
        assert held[samples_topic] + held[topic(env, JOB_EVENTS)] == len(events), held
        # the broker's short answer this test is about (else it tests nothing)
        async with TopicReader(settings, [samples_topic], client_id="probe") as reader:
            (end,) = reader.end_hint.values()
        assert end < held[samples_topic], f"tansu answered the true end {end}"

        caplog.set_level(logging.WARNING, logger="streams.brain")
        brain = Brain(settings, env, pg_dsn, checkpoint_every_s=0.5)
        await brain.start()
        lag = {"env": env, "topic": samples_topic, "partition": "0"}
        try:

            def measured() -> list[float]:
                return [
                    s.value
                    for m in brain.metrics.consumer_lag.collect()
                    for s in m.samples
                    if s.labels == lag
                ]

            await wait_for(
                lambda: bool(measured()) and 0 in brain.processor.loaded,
                timeout_s=60,
                what="the brain to resume and measure its lag",
            )
            await asyncio.sleep(2)  # a checkpoint or more
            assert measured() == [0]
            assert brain.processor.counters.processed == 0
        finally:
            await brain.stop()
        said = [r.getMessage() for r in caplog.records if "the log ends at" in r.getMessage()]
        assert not said, said
        async with await EnvStore.open(pg_dsn, env) as store:
            rows = await store.fetch("SELECT topic, next_offset FROM brain_offsets")
        assert {r["topic"]: r["next_offset"] for r in rows} == held
        on_topic = [p.plan_id for p in await plans_on(settings, topic(env, SCALE_PLANS))]
        assert sorted(on_topic) == sorted(scale), "plans were published again"
    finally:
        with contextlib.suppress(Exception):
            await registry.delete(env, force=True)
