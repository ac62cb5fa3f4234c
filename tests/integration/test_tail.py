"""`tail` follows live events on the real broker, filtered, without a consumer group."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.tail import Filter, Line
from dlrover_events.bus.tailer import follow
from dlrover_events.bus.topics import JOB_EVENTS, JOB_METRICS, topic
from dlrover_events.settings import Settings
from schemas import JobMeta, JobStarted
from tests.conftest import EnvFactory
from tests.integration.test_bus import sample

pytestmark = pytest.mark.integration


async def test_tail_follows_live_events_filtered_by_job(
    settings: Settings, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    lines: list[Line] = []
    ready = asyncio.Event()
    task = asyncio.create_task(
        follow(
            settings,
            env,
            [JOB_METRICS, JOB_EVENTS],
            lines.append,
            where=Filter(job="job-b"),
            max_events=3,
            ready=ready,
        )
    )
    await asyncio.wait_for(ready.wait(), 10)
    async with Producer(settings) as producer:
        for step in range(3):
            await producer.publish(sample(env, "job-a", step))
            await producer.publish(sample(env, "job-b", step))
        await producer.send_raw(topic(env, JOB_EVENTS), b"junk", b"job-b")
    assert await asyncio.wait_for(task, 10) == 3
    assert [ln.event.key for ln in lines if ln.event] == ["job-b"] * 3


async def test_tail_from_beginning_and_since(settings: Settings, make_env: EnvFactory) -> None:
    env = (await make_env(partitions=1)).name
    async with Producer(settings) as producer:
        await producer.publish(JobStarted(env=env, job=JobMeta(uuid="j")))
        await producer.send_raw(topic(env, JOB_EVENTS), b"junk", b"j")
    early: list[Line] = []
    n = await asyncio.wait_for(
        follow(settings, env, [JOB_EVENTS], early.append, start="earliest", max_events=2), 10
    )
    assert n == 2
    assert early[0].event is not None and early[0].event.type == "job.started"
    assert early[1].event is None and early[1].error and "malformed" in early[1].error

    since: list[Line] = []
    stop = asyncio.Event()
    task = asyncio.create_task(
        follow(
            settings,
            env,
            [JOB_EVENTS],
            since.append,
            start=datetime.now(UTC) - timedelta(minutes=10),
            stop=stop,
        )
    )
    await asyncio.sleep(1.5)
    stop.set()
    await asyncio.wait_for(task, 10)
    assert len(since) == 2
