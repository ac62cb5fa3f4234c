"""Env registry on the real broker and Postgres."""

from __future__ import annotations

import asyncpg
import pytest

from dlrover_events.admin import TopicAdmin
from dlrover_events.bus import read_topic
from dlrover_events.envs import EnvRegistry
from dlrover_events.errors import EnvError
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore, env_schema
from dlrover_events.topics import CONTROL_TOPIC, ENV_TOPIC_NAMES
from schemas.codec import decode
from schemas.control import EnvAnnouncement, EnvMode
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
