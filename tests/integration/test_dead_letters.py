"""Dead letters on the real broker and Postgres: a letter always fits what a producer may
send, and a consumer (the archiver service itself) goes on past any bad record."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from dlrover_events.bus.dead_letters import send_dead_letters
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import DLQ, JOB_EVENTS, topic
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from schemas import JobMeta, JobStarted, decode
from schemas.bounds import MAX_EVENT_BYTES
from schemas.dlq import MAX_ORIGINAL_VALUE_BYTES, DeadLetter, FailureKind
from streams import archiver
from tests.conftest import EnvFactory

pytestmark = pytest.mark.integration

#: A bad record as large as a producer may send (aiokafka's max_request_size is 1 MiB).
BIG = 1_000_000


async def _archived(store: EnvStore, event_id: object, timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        rows = await store.fetch("SELECT 1 FROM events_archive WHERE event_id = $1", event_id)
        if rows:
            return True
        await asyncio.sleep(0.2)
    return False


async def test_a_1_mb_bad_record_is_dead_lettered_truncated_and_the_archiver_goes_on(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env(partitions=1)).name
    events = topic(env, JOB_EVENTS)
    bad = b"{" + b"x" * (BIG - 1)  # not JSON, and base64 of it is 1.33 MB
    after = JobStarted(env=env, job=JobMeta(uuid="job-1"))
    async with Producer(settings) as producer:
        await producer.send_raw(events, bad, b"job-1")
        await producer.publish(after)

    ctx = ServiceContext(settings, env, pg_dsn)
    service = asyncio.create_task(archiver.run(ctx))
    store = await EnvStore.open(pg_dsn, env, max_size=1)
    try:
        archived = await _archived(store, after.event_id, 30)
        assert not service.done(), f"the archiver stopped: {service.exception()!r}"
        assert archived, "the valid event after the bad record was archived"
        letters = [decode(r.value) for r in await read_topic(settings, topic(env, DLQ), expect=1)]
        assert len(letters) == 1
        letter = letters[0]
        assert isinstance(letter, DeadLetter)
        assert letter.error_kind == FailureKind.MALFORMED
        assert letter.error.startswith("not JSON"), "the reason is kept"
        assert letter.truncated and letter.original_size == BIG
        assert letter.value_bytes() == bad[:MAX_ORIGINAL_VALUE_BYTES]
        assert letter.key_bytes() == b"job-1" and letter.original_key_size == 5
        # the letter is itself a valid event: the archiver, which reads the dlq, kept it
        assert await _archived(store, letter.event_id, 30)
    finally:
        ctx.stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(service, 15)
        await store.close()


async def test_a_letter_the_broker_refuses_is_sent_without_the_original_bytes(
    settings: Settings, make_env: EnvFactory
) -> None:
    """Whatever built it, a letter too large to send does not stop its publisher."""
    env = (await make_env(partitions=1)).name
    huge = DeadLetter(
        env=env,
        original_topic=topic(env, JOB_EVENTS),
        partition=0,
        offset=7,
        original_value=DeadLetter.b64(b"y" * (2 * MAX_EVENT_BYTES)),
        error_kind=FailureKind.MALFORMED,
        error="too large to keep",
    )
    small = huge.model_copy(update={"offset": 8, "original_value": DeadLetter.b64(b"ok")})
    async with Producer(settings) as producer:
        sent = await asyncio.wait_for(send_dead_letters(producer, [huge, small]), 30)
    assert sent == 2
    got = [decode(r.value) for r in await read_topic(settings, topic(env, DLQ), expect=2)]
    by_offset = {x.offset: x for x in got if isinstance(x, DeadLetter)}
    assert by_offset[7].original_value is None and by_offset[7].truncated
    assert by_offset[7].error == "too large to keep"
    assert by_offset[8].value_bytes() == b"ok" and not by_offset[8].truncated
