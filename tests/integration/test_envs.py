"""Env registry on the real broker and Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import os

import asyncpg
import pytest

from dlrover_events.bus.admin import TopicAdmin
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import CONTROL_TOPIC, ENV_TOPIC_NAMES
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import EnvError
from dlrover_events.runtime.fence import EnvFence, fenced
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore, env_schema
from schemas import JobMeta, JobSubmitted
from schemas.codec import decode
from schemas.control import EnvAnnouncement, EnvMode
from streams.archiver import service as archiver_service
from tests.conftest import EnvFactory, unique_env

pytestmark = pytest.mark.integration


async def test_create_makes_topics_schema_and_announcement(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    rec = await make_env(partitions=2)
    async with TopicAdmin(settings) as admin:
        topics = set(await admin.list_topics())
    assert {f"{rec.name}.{t}" for t in ENV_TOPIC_NAMES} <= topics
    store = await EnvStore.open(pg_dsn, rec.name)
    async with store:
        tables = await store.tables()
    assert not {"jobs", "nodes", "runtime_samples"} & set(tables)  # never written: dropped
    assert {
        "job_states",
        "brain_offsets",
        "job_sample_chunks",
        "plans",
        "scale_plans",
        "configs",
        "evaluation_results",
        "events_archive",
        "schema_migrations",
    } <= set(tables)
    records = await read_topic(settings, CONTROL_TOPIC)
    announced = [decode(r.value) for r in records if r.key == rec.name.encode() and r.value]
    assert announced
    last = announced[-1]
    assert isinstance(last, EnvAnnouncement)
    assert (last.name, last.mode, last.partitions) == (rec.name, EnvMode.VIRTUAL, 2)


async def test_migrations_apply_once_and_are_recorded(pg_dsn: str, make_env: EnvFactory) -> None:
    rec = await make_env()
    conn = await asyncpg.connect(pg_dsn)
    try:
        rows = await conn.fetch(
            f"SELECT version, name FROM {env_schema(rec.name)}.schema_migrations ORDER BY 1"
        )
    finally:
        await conn.close()
    assert [r["version"] for r in rows] == sorted({r["version"] for r in rows})
    assert rows[0]["version"] == 1


async def test_only_one_real_env(settings: Settings, pg_dsn: str, make_env: EnvFactory) -> None:
    registry = EnvRegistry(settings, pg_dsn)
    existing = await registry.real()
    real = existing.name if existing else (await make_env(mode=EnvMode.REAL)).name
    with pytest.raises(EnvError, match="already the real env"):
        await registry.create(unique_env(), EnvMode.REAL)
    assert (await registry.real()) is not None
    assert (await registry.real()).name == real  # type: ignore[union-attr]


async def test_delete_removes_topics_and_schema_and_tombstones(
    settings: Settings, pg_dsn: str
) -> None:
    registry = EnvRegistry(settings, pg_dsn)
    name = unique_env()
    await registry.create(name)
    await registry.delete(name)
    assert await registry.get(name) is None
    async with TopicAdmin(settings) as admin:
        assert not [t for t in await admin.list_topics() if t.startswith(f"{name}.")]
    conn = await asyncpg.connect(pg_dsn)
    try:
        assert not await conn.fetchval(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = $1", env_schema(name)
        )
    finally:
        await conn.close()
    records = await read_topic(settings, CONTROL_TOPIC)
    mine = [r for r in records if r.key == name.encode()]
    assert mine[-1].value is None  # tombstone


async def test_duplicate_and_unknown_envs_are_clear_errors(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    registry = EnvRegistry(settings, pg_dsn)
    rec = await make_env()
    with pytest.raises(EnvError, match="already exists"):
        await registry.create(rec.name)
    with pytest.raises(EnvError, match="no env named"):
        await registry.delete(unique_env())


async def _archived(pg_dsn: str, env: str, event_id: object) -> bool:
    store = await EnvStore.open(pg_dsn, env)
    async with store:
        rows = await store.fetch("SELECT 1 FROM events_archive WHERE event_id = $1", event_id)
    return bool(rows)


async def test_delete_fences_a_running_service_before_the_env_can_come_back(
    settings: Settings, pg_dsn: str
) -> None:
    """A service of a deleted env stopped, before the delete returned: it never meets
    the env created again under its name (it used to consume its topics and write into
    its schema)."""
    registry = EnvRegistry(settings, pg_dsn)
    name = unique_env()
    await registry.create(name)
    ctx = ServiceContext(settings, name, pg_dsn)

    async def archiver() -> None:
        async with fenced(ctx):
            await archiver_service.run(ctx)

    task = asyncio.create_task(archiver())
    try:
        async with asyncio.timeout(30):
            await ctx.ready.wait()
        first = JobSubmitted(env=name, job=JobMeta(uuid="fenced-1"))
        async with Producer(settings) as producer:
            await producer.publish(first)
        for _ in range(300):
            if await _archived(pg_dsn, name, first.event_id):
                break
            await asyncio.sleep(0.1)
        assert await _archived(pg_dsn, name, first.event_id), "archived before the delete"
        await registry.delete(name)
        assert task.done(), "the env's archiver stopped before the delete returned"
        assert ctx.stop.is_set()
        await task  # it stopped cleanly, without an error
        await registry.create(name)  # the name is free again, with a new incarnation
    finally:
        ctx.stop.set()
        await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(EnvError):
            await registry.delete(name)


async def test_a_process_that_does_not_stop_holds_the_delete_and_is_named(
    settings: Settings, pg_dsn: str
) -> None:
    name = unique_env()
    quick = settings.with_overrides(env_delete_timeout_s=0.5)
    registry = EnvRegistry(quick, pg_dsn)
    await registry.create(name)
    ignored = asyncio.Event()  # its holder never looks at it
    async with EnvFence(quick, pg_dsn, name, ignored) as fence:
        with pytest.raises(EnvError, match=rf"did not stop within .*pid {os.getpid()}"):
            await registry.delete(name)
        assert ignored.is_set() and fence.reason is not None and "deleted" in fence.reason
        assert await registry.get(name) is None, "the env is gone for new processes"
        with pytest.raises(EnvError, match="is being deleted"):
            await registry.create(name)
        with pytest.raises(EnvError, match="being deleted"):
            async with EnvFence(quick, pg_dsn, name, asyncio.Event()):
                pass
    await registry.delete(name)  # once it stopped, the delete goes through
    conn = await asyncpg.connect(pg_dsn)
    try:
        assert not await conn.fetchval(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = $1", env_schema(name)
        )
    finally:
        await conn.close()


async def test_a_fence_refuses_an_env_that_does_not_exist(settings: Settings, pg_dsn: str) -> None:
    with pytest.raises(EnvError, match="no env named"):
        async with EnvFence(settings, pg_dsn, unique_env(), asyncio.Event()):
            pass
