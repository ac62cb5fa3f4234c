"""A restarted `up` has its history (broker_storage=postgres, the default): its broker is
refilled from the journal before any service starts, every record at its offset, and the
brain goes on from its checkpoint without reading anything again."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import urllib.error
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topics
from dlrover_events.bus.topics import JOB_EVENTS, SCALE_PLANS, topic
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from schemas import encode
from schemas.jobs import JobMeta
from tests.conftest import unique_env
from tests.integration.brain.workload import expected_plans, job_events, plans_on
from tests.integration.test_up import Up, up_environ

pytestmark = pytest.mark.integration


async def publish(settings: Settings, env: str, job: str, count: int) -> set[str]:
    """One job's events; the ScalePlan ids a brain makes of them."""
    events = job_events(env, JobMeta(uuid=job), count)
    async with Producer(settings) as producer:
        for event in events:
            assert event.key is not None
            await producer.send_raw(topic(env, JOB_EVENTS), encode(event), event.key.encode())
    _, scale = expected_plans(events)
    assert scale
    return scale


async def scale_plans(settings: Settings, env: str, want: int) -> list[str]:
    """The ScalePlan ids on the env's topic, once it holds `want` of them (60 s at most)."""
    for _ in range(600):
        ids = [p.plan_id for p in await plans_on(settings, topic(env, SCALE_PLANS))]
        if len(ids) >= want:
            return ids
        await asyncio.sleep(0.1)
    raise AssertionError(f"the brain made {len(ids)} of {want} ScalePlans")


async def history(settings: Settings, env: str) -> list[tuple[str, int, int, bytes | None]]:
    records = await read_topics(settings, [topic(env, JOB_EVENTS), topic(env, SCALE_PLANS)])
    return sorted((r.topic, r.partition, r.offset, r.value) for r in records)


def ready(up: Up) -> bool:
    """/readyz says ready (between the broker's death and its refill nothing answers)."""
    try:
        return up.get("/readyz")[0] == 200
    except urllib.error.URLError:
        return False


async def test_a_restarted_up_has_its_history_and_its_brain_resumes(
    own_pg: str, tmp_path: Path
) -> None:
    env = unique_env("hist")
    environ = up_environ(
        own_pg,
        tmp_path,
        DLROVER_EVENTS_BROKER_STORAGE="postgres",
        # the journal in the test's own database: no other `up` of the suite shares it
        DLROVER_EVENTS_BROKER_DATABASE=urlsplit(own_pg).path.lstrip("/"),
        DLROVER_EVENTS_DEFAULT_ENV=env,
    )
    services = ("-s", "brain", "-s", "archiver")
    up = Up(environ, *services)
    try:
        await up.started()
        servers = re.findall(r"127\.0\.0\.1:\d+", up.stdout)[0]
        settings = Settings(bootstrap_servers=servers, pg_dsn=own_pg)
        first = await publish(settings, env, "job-before", 40)
        assert set(await scale_plans(settings, env, len(first))) == first
        before = await history(settings, env)
    finally:
        rc = await up.stop()
    assert rc == 0, up.stderr
    async with await EnvStore.open(own_pg, env) as store:
        held = {r["topic"]: r["next_offset"] for r in await store.fetch(
            "SELECT topic, next_offset FROM brain_offsets")}  # fmt: skip
    assert held[topic(env, JOB_EVENTS)] == 2 + 40, held

    again = Up(environ, *services)
    try:
        await again.started()
        assert "broker refilled from its journal" in again.stderr, again.stderr
        assert await history(settings, env) == before, "every record back at its offset"

        second = await publish(settings, env, "job-after", 12)
        ids = await scale_plans(settings, env, len(first) + len(second))
        await asyncio.sleep(2)  # a brain that read its input again would add plans now
        ids = [p.plan_id for p in await plans_on(settings, topic(env, SCALE_PLANS))]
        assert sorted(ids) == sorted(first | second), "each decided once, the new ones too"
        assert "log restarted" not in again.stderr, again.stderr
    finally:
        rc = await again.stop()
    assert rc == 0, again.stderr
    async with await EnvStore.open(own_pg, env) as store:
        now = {r["topic"]: r["next_offset"] for r in await store.fetch(
            "SELECT topic, next_offset FROM brain_offsets")}  # fmt: skip
    assert now[topic(env, JOB_EVENTS)] == 2 + 40 + 2 + 12, now


async def test_a_broker_that_dies_under_up_comes_back_with_its_history(
    own_pg: str, tmp_path: Path
) -> None:
    """The services stop, the broker starts again and is refilled, then the services start
    again: none of them meets the broker empty."""
    env = unique_env("hist")
    environ = up_environ(
        own_pg,
        tmp_path,
        DLROVER_EVENTS_BROKER_STORAGE="postgres",
        DLROVER_EVENTS_BROKER_DATABASE=urlsplit(own_pg).path.lstrip("/"),
        DLROVER_EVENTS_DEFAULT_ENV=env,
    )
    up = Up(environ, "-s", "brain")
    try:
        await up.started()
        servers = re.findall(r"127\.0\.0\.1:\d+", up.stdout)[0]
        settings = Settings(bootstrap_servers=servers, pg_dsn=own_pg)
        first = await publish(settings, env, "job-before", 20)
        assert set(await scale_plans(settings, env, len(first))) == first
        before = await history(settings, env)
        await asyncio.sleep(1.5)  # the journal copies within 0.2 s; a crash loses no more
        os.kill(up.broker_pid, signal.SIGKILL)
        await up.wait_for(lambda: "starting it again with its history" in up.stderr, "up said it")
        await up.wait_for(
            lambda: up.stderr.count("broker refilled from its journal") == 2, "refilled"
        )
        await up.wait_for(lambda: ready(up), "ready again")
        assert await history(settings, env) == before
        second = await publish(settings, env, "job-after", 8)
        ids = await scale_plans(settings, env, len(first) + len(second))
        assert sorted(ids) == sorted(first | second)
        assert "log restarted" not in up.stderr, up.stderr
        assert up.proc.poll() is None
    finally:
        rc = await up.stop()
    assert rc == 0, up.stderr
