"""A broker outage as a training process's log shows it: two lines of ours, none of aiokafka's.

A real tansu broker of the test's own is killed while the job trains and started again on
the same port; every event made meanwhile is published once it is back.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from dlrover_events.bus.admin import TopicAdmin
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import JOB_METRICS, topic
from dlrover_events.runtime.embedded import Broker
from dlrover_events.sdk import JobIdentity, Reporter
from dlrover_events.settings import Settings
from schemas.codec import decode
from schemas.jobs import JobMeta, RuntimeSample
from tests.conftest import ARTIFACTS, unique_env

pytestmark = pytest.mark.integration


@pytest.fixture
def own_broker() -> Iterator[Broker]:
    broker = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs" / "sdk-outage")
    broker.start()
    yield broker
    broker.stop()


async def create_topics(settings: Settings, env: str) -> None:
    async with TopicAdmin(settings) as admin:
        await admin.ensure_env_topics(env, 2)


def train(reporter: Reporter, stop: threading.Event, go: threading.Event) -> None:
    while not stop.is_set():
        go.wait()
        reporter.step(samples=8)
        time.sleep(0.002)


async def test_an_outage_is_two_lines_of_ours_and_none_of_aiokafka(
    own_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    # Everything aiokafka says, at any level, would be captured if it got through.
    caplog.set_level(logging.DEBUG)
    settings = Settings(bootstrap_servers=own_broker.bootstrap_servers, request_timeout_ms=5000)
    env = unique_env("sdk")
    await create_topics(settings, env)
    reporter = Reporter(
        JobIdentity(job=JobMeta(uuid="job-outage"), env=env),
        settings=settings,
        interval_s=0.02,
        send_timeout_s=1.0,
        retry_backoff_max_s=0.5,
    ).start()
    stop, go = threading.Event(), threading.Event()
    go.set()
    trainer = threading.Thread(target=train, args=(reporter, stop, go))
    trainer.start()
    try:
        await asyncio.sleep(0.3)
        go.clear()  # a pause, so that nothing is published between the flush and the kill
        assert await asyncio.to_thread(reporter.flush, 10.0), reporter.stats()
        before = reporter.stats()
        own_broker.kill()
        go.set()
        deadline = time.monotonic() + 30
        while reporter.stats().connected:
            assert time.monotonic() < deadline, "the reporter never noticed the broker died"
            await asyncio.sleep(0.05)
        await asyncio.sleep(3.0)  # an outage of a few seconds, as measured in the issue
        own_broker.start()
        await create_topics(settings, env)  # the broker keeps topics in memory
        assert await asyncio.to_thread(reporter.flush, 30.0), reporter.stats()
    finally:
        stop.set()
        go.set()
        trainer.join()
        final = await asyncio.to_thread(reporter.close, 10.0)

    assert final.dropped == 0 and final.pending == 0
    assert final.published == final.samples > before.published
    records = await read_topic(settings, topic(env, JOB_METRICS), timeout_s=10)
    after = {decode(r.value).event_id for r in records}  # the restarted broker's log only
    assert all(isinstance(decode(r.value), RuntimeSample) for r in records)
    assert len(after) == final.published - before.published

    in_reporter = [r for r in caplog.records if r.threadName.startswith("dlrover-events-reporter")]
    kafka = [f"{r.name}: {r.getMessage()}" for r in in_reporter if r.name.startswith("aiokafka")]
    assert kafka == []
    ours = [r.getMessage() for r in in_reporter if r.levelno >= logging.WARNING]
    assert len(ours) == 2, ours
    assert f"broker {own_broker.bootstrap_servers} unreachable since" in ours[0]
    assert "events buffered" in ours[0]
    assert f"reconnected to {own_broker.bootstrap_servers} after" in ours[1]
    assert "0 events dropped meanwhile" in ours[1]
