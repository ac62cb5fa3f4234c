"""A brain beside `up`'s broker journal (issue 37, 4): its checkpoint never covers what the
journal has not copied, so after a crash of `up` (the broker refilled without the records
of its last moments) the refilled logs are never shorter than the checkpoint: nothing is
folded twice, no state keeps a record that no topic holds, and no log is taken for
restarted. Real tansu brokers, a real journal in the env's own database."""

from __future__ import annotations

import contextlib
import logging

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import JOB_EVENTS, SCALE_PLANS, topic
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.runtime.broker_journal import BrokerJournal
from dlrover_events.runtime.embedded import Broker
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from schemas import encode
from schemas.jobs import JobMeta
from streams.brain.runtime.app import Brain
from tests.conftest import ARTIFACTS, unique_env
from tests.integration.brain.workload import expected_plans, job_events, plans_on, wait_for

pytestmark = pytest.mark.integration


def _broker() -> Broker:
    broker = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs")
    broker.start()
    return broker


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
    events = job_events(env, JobMeta(uuid=job), count)
    async with Producer(settings) as producer:
        for event in events:
            assert event.key is not None
            await producer.send_raw(topic(env, JOB_EVENTS), encode(event), event.key.encode())
    _, scale = expected_plans(events)
    assert scale
    return scale


async def _checkpointed(pg_dsn: str, env: str) -> dict[str, int]:
    async with await EnvStore.open(pg_dsn, env) as store:
        rows = await store.fetch("SELECT topic, next_offset FROM brain_offsets")
    return {r["topic"]: r["next_offset"] for r in rows}


async def test_a_checkpoint_never_covers_what_the_journal_lacks(
    journal: BrokerJournal, own_pg: str, caplog: pytest.LogCaptureFixture
) -> None:
    first = _broker()
    second: Broker | None = None
    env = unique_env("bj")
    try:
        settings = _settings(first, own_pg)
        await journal.attach(first.bootstrap_servers)
        await journal.refill()  # an empty journal: it follows this broker from now on
        await EnvRegistry(settings, own_pg).create(env, partitions=1)
        kept = await _publish(settings, env, "job-kept", 20)
        assert await journal.drain()  # copied: these survive the crash
        # acknowledged, never copied: the journal's copy is late (it copies every 0.2 s)
        lost = await _publish(settings, env, "job-lost", 20)

        brain = Brain(settings, env, own_pg, checkpoint_every_s=0.3)
        await brain.start()
        try:
            await wait_for(
                lambda: brain.processor.counters.scale_plans >= len(kept | lost),
                what="the brain decided every record, those not copied too",
            )
            with contextlib.suppress(Exception):
                await brain.checkpoint()  # what the loop does: held to the journal's copy
            held = await _checkpointed(own_pg, env)
            assert held.get(topic(env, JOB_EVENTS), 0) <= 2 + 20, held
            assert held.get(topic(env, SCALE_PLANS), 0) == 0, "no plan was copied"
            brain.halt()  # a crash: nothing more is written
        finally:
            await brain.stop()
        first.kill()

        # `up` again: a new broker, refilled from the journal, without job-lost's records
        second = _broker()
        settings = _settings(second, own_pg)
        await journal.attach(second.bootstrap_servers)
        await journal.refill()
        caplog.set_level(logging.WARNING, logger="streams.brain")
        again = Brain(settings, env, own_pg, checkpoint_every_s=0.3)
        await again.start()
        try:
            events = (topic(env, JOB_EVENTS), 0)
            await wait_for(
                lambda: again.processor.offsets.get(events) == 2 + 20,
                what="the brain read the refilled log to its end",
            )
        finally:
            await again.stop()
        said = [r.getMessage() for r in caplog.records if "the log ends at" in r.getMessage()]
        assert not said, said
        assert "job-lost" not in again.processor.states, "no state keeps what no topic holds"
        on_topic = {p.plan_id for p in await plans_on(settings, topic(env, SCALE_PLANS))}
        assert on_topic <= kept, on_topic - kept
    finally:
        first.stop()
        if second is not None:
            second.stop()
