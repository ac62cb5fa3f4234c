"""The group-less reader on the real broker: to the end, from a time, from offsets."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import pytest
from aiokafka import TopicPartition

from dlrover_events.bus.admin import TopicAdmin
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import TopicReader, read_topics
from dlrover_events.bus.topics import JOB_EVENTS, JOB_METRICS, topic
from dlrover_events.errors import UserError
from dlrover_events.runtime.embedded import Broker
from dlrover_events.settings import Settings
from schemas import JobMeta, RuntimeSample, decode
from tests.conftest import EnvFactory
from tests.integration.tap import DEADLINE_S

pytestmark = pytest.mark.integration


def sample(env: str, job: str, step: int) -> RuntimeSample:
    return RuntimeSample(env=env, job=JobMeta(uuid=job), global_step=step, speed=1.0)


async def test_reads_every_partition_of_several_topics_to_the_end(
    settings: Settings, make_env: EnvFactory
) -> None:
    env = (await make_env(partitions=3)).name
    async with Producer(settings) as producer:
        await producer.publish_many(
            [sample(env, f"job-{j}", s) for j in range(6) for s in range(5)]
        )
    records = await read_topics(settings, [topic(env, JOB_METRICS), topic(env, JOB_EVENTS)])
    assert len(records) == 30
    assert len({r.partition for r in records}) > 1  # six jobs spread over the partitions
    steps: dict[str, list[int]] = {}
    for r in records:
        event = decode(r.value)
        assert isinstance(event, RuntimeSample)
        steps.setdefault(event.job.uuid, []).append(event.global_step)
    assert all(found == list(range(5)) for found in steps.values())  # each job in order
    # a missing topic reads as empty for read_topics, and is a user error for a reader
    assert await read_topics(settings, [f"{env}.no-such-topic"]) == []
    with pytest.raises(UserError, match="no-such-topic does not exist; is it created"):
        async with TopicReader(
            settings, [f"{env}.no-such-topic"], client_id="t", missing="is it created"
        ):
            pass


async def test_starts_at_a_time_or_at_given_offsets(
    settings: Settings, make_env: EnvFactory
) -> None:
    env = (await make_env(partitions=1)).name
    name = topic(env, JOB_METRICS)
    async with Producer(settings) as producer:
        await producer.publish_many([sample(env, "job-a", s) for s in range(3)])
        await asyncio.sleep(0.05)
        middle = datetime.now(UTC)
        await asyncio.sleep(0.05)
        await producer.publish_many([sample(env, "job-a", s) for s in range(3, 5)])
    later = await read_topics(settings, [name], begin=middle)
    assert [r.offset for r in later] == [3, 4]
    from_two = await read_topics(settings, [name], begin={TopicPartition(name, 0): 2})
    assert [r.offset for r in from_two] == [2, 3, 4]
    async with TopicReader(settings, [name], client_id="t", begin="latest") as reader:
        # tansu's end is the last batch's base offset + 1 (a lower bound): "latest" may
        # still hold the rest of that batch, never anything before it
        assert all(r.offset >= 3 for r in await reader.read_to_end(timeout_s=2))
        assert await reader.caught_up()


async def test_says_which_logs_end_before_an_offset_by_their_records(
    settings: Settings, make_env: EnvFactory
) -> None:
    """tansu's end offset of a log written in a burst is far below its true end; whether
    the log reaches an offset is asked of the records, which cannot be short."""
    env = (await make_env(partitions=2)).name
    name = topic(env, JOB_METRICS)
    async with Producer(settings, linger_ms=0) as producer:
        await producer.publish_many([sample(env, "job-a", s) for s in range(620)])
    async with TopicReader(settings, [name], client_id="t") as reader:
        (full,) = [tp for tp, end in reader.end_hint.items() if end > 0]
        empty = next(tp for tp in reader.partitions if tp != full)
        assert reader.end_hint[full] < 620  # the short answer (else this tests nothing)
        short = await reader.short_of({full: 620, empty: 0})
        assert short == {}
        short = await reader.short_of({full: 621, empty: 3})
        assert short == {full: 620, empty: 0}
        with pytest.raises(ValueError, match="not assigned"):
            await reader.short_of({TopicPartition(name, 7): 1})
        # the reader reads on from where it is asked to
        await reader.seek({full: 618})
        assert [r.offset for r in await reader.read_to_end()] == [618, 619]


async def test_a_reader_stops_whole_while_a_failed_fetch_waits_out_its_backoff(
    settings: Settings, own_broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """aiokafka's consumer stop raises a cancellation of its own when a fetch is sleeping
    out its retry backoff after a failure, and then never closes its client
    (aio-libs/aiokafka#647). The reader's stop does neither."""
    mine = settings.model_copy(update={"bootstrap_servers": own_broker.bootstrap_servers})
    async with TopicAdmin(mine) as admin:
        [name, *_] = await admin.ensure_env_topics("tstop", 1)
    reader = TopicReader(mine, [name], client_id="t", retry_backoff_ms=600_000)
    await reader.start()
    caplog.set_level(logging.ERROR, logger="aiokafka.consumer.fetcher")
    await reader.fetch(timeout_ms=100)  # the fetcher has a fetch in flight now
    own_broker.kill()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not any("Failed fetch messages" in r.getMessage() for r in caplog.records):
        assert loop.time() < deadline, "no fetch failed after the broker died"
        await asyncio.sleep(0.05)
    await asyncio.wait_for(reader.stop(), DEADLINE_S)  # not CancelledError, not a hang
    client = reader.consumer._client
    assert client._sync_task is None  # closed: its metadata task gone
    assert all(conn.connected() is False for conn in client._conns.values())
    assert all(task.done() for task in reader.consumer._fetcher._pending_tasks)
