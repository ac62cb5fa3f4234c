"""A restarted `up` has its history (broker_storage=postgres, the default): its broker is
refilled from the journal before any service starts, every record at its offset, and the
brain goes on from its checkpoint without reading anything again."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from dlrover_events.bus.kafka_client import stop_consumer
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topics
from dlrover_events.bus.topics import JOB_EVENTS, SCALE_PLANS, topic
from dlrover_events.runtime.embedded import free_port, with_database
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from dlrover_events.store.database import quote_ident
from schemas import encode
from schemas.jobs import JobMeta
from tests.conftest import _admin, unique_env
from tests.integration.brain.workload import expected_plans, job_events, plans_on
from tests.integration.operator.processes import Service
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


class Outsider:
    """A consumer of a group of the env that `up` does not run (as a standalone brain is):
    it polls and commits all along, and reconnects by itself when the broker comes back."""

    def __init__(self, servers: str, env: str) -> None:
        self.consumer = AIOKafkaConsumer(
            topic(env, JOB_EVENTS),
            bootstrap_servers=servers,
            group_id=f"{env}.outsider",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=6000,
            heartbeat_interval_ms=300,
        )
        self.seen = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(KafkaError):
                batch = await self.consumer.getmany(timeout_ms=200)
                self.seen += sum(len(rs) for rs in batch.values())
                if batch:
                    await self.consumer.commit()

    async def __aenter__(self) -> Outsider:
        await self.consumer.start()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await stop_consumer(self.consumer)


def readyz(up: Up) -> int:
    """/readyz's status, 0 when nothing answers."""
    return status(up.metrics_port)


def status(port: int) -> int:
    """The status of /readyz on 127.0.0.1:port, 0 when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, ConnectionError):
        return 0


async def test_up_outlives_its_broker_with_a_group_member_outside_it_and_says_not_ready(
    own_pg: str, tmp_path: Path
) -> None:
    """kill -9 of tansu while a consumer outside `up` is in a group: the refill cannot
    commit that group's offsets (Kafka refuses a group-less commit while it has members),
    and `up` exited with a traceback there (issue 37, 2 of 2). Now the group is left to its
    member, `up` stays up, and /readyz says 503 (not 200 from services that are stopping,
    nor nothing) from the broker's death until its services are ready again."""
    env = unique_env("hist")
    environ = up_environ(
        own_pg,
        tmp_path,
        DLROVER_EVENTS_BROKER_STORAGE="postgres",
        DLROVER_EVENTS_BROKER_DATABASE=urlsplit(own_pg).path.lstrip("/"),
        DLROVER_EVENTS_DEFAULT_ENV=env,
    )
    up = Up(environ, "-s", "archiver")
    try:
        await up.started()
        servers = re.findall(r"127\.0\.0\.1:\d+", up.stdout)[0]
        settings = Settings(bootstrap_servers=servers, pg_dsn=own_pg)
        # records enough that the refill lasts a while: the outsider is back in its group
        # before the refill commits the groups' offsets (a brain of the issue was at once)
        await bulk(servers, f"{env}.bulk", 20_000)
        alone_port = free_port()
        alone = Service(
            settings,
            own_pg,
            ["archiver", "--env", env],
            tmp_path / "archiver.log",
            extra_env={"DLROVER_EVENTS_METRICS_PORT": str(alone_port)},
        )
        await alone.start()
        async with Outsider(servers, env) as outsider:
            await publish_events(settings, env, 10)
            await up.wait_for(lambda: outsider.seen >= 10, "the outsider read the events")
            await asyncio.sleep(2.5)  # its commit journaled (every 2 s)
            await up.wait_for(lambda: readyz(up) == 200, "up ready")
            await up.wait_for(lambda: status(alone_port) == 200, "the service alone ready")
            os.kill(up.broker_pid, signal.SIGKILL)
            killed = time.monotonic()
            answers: list[tuple[float, int, int]] = []
            while up.stderr.count("broker refilled from its journal") < 2:
                assert up.proc.poll() is None, up.stderr
                codes = await asyncio.gather(
                    asyncio.to_thread(readyz, up), asyncio.to_thread(status, alone_port)
                )
                answers.append((time.monotonic() - killed, *codes))
                await asyncio.sleep(0.05)
            for which in (1, 2):  # up's /readyz, then the one of the service alone
                first = next(a for a in answers if a[which] != 200)
                print(f"\n/readyz of {('up', 'the service alone')[which - 1]} after kill -9 of "
                      f"tansu: first {first[which]} at {first[0]:.2f}s")  # fmt: skip
                assert first[which] == 503, answers
                after = [a[which] for a in answers[answers.index(first) :]]
                # 503 until the broker is refilled, then ready again for good: a service
                # may say 200 a moment before `up` has logged its refill (seen in a CI
                # run: the service alone read the journal's end first), never 200 and then
                # 503 again, nor a refused connection
                back = after.index(200) if 200 in after else len(after)
                assert set(after[:back]) == {503} and set(after[back:]) <= {200}, answers
            await up.wait_for(lambda: readyz(up) == 200, "up ready again")
            await up.wait_for(lambda: status(alone_port) == 200, "the service alone too")
            assert "left to their live members" in up.stderr, up.stderr
            await publish_events(settings, env, 5, job="job-after")
            await up.wait_for(lambda: outsider.seen >= 15, "the outsider reads on")
            alone.alive()
            await alone.stop()
        assert up.proc.poll() is None, up.stderr
        assert "Traceback" not in up.stderr, up.stderr
    finally:
        rc = await up.stop()
    assert rc == 0, up.stderr


async def publish_events(settings: Settings, env: str, count: int, job: str = "job") -> None:
    events = job_events(env, JobMeta(uuid=job), count)
    async with Producer(settings) as producer:
        for event in events[:count]:
            assert event.key is not None
            await producer.send_raw(topic(env, JOB_EVENTS), encode(event), event.key.encode())


async def bulk(servers: str, name: str, count: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 1, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=servers, linger_ms=20)
    await producer.start()
    try:
        sent = [await producer.send(name, b"x" * 100) for _ in range(count)]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def test_two_stacks_with_their_own_databases_never_see_each_others_records(
    own_pg: str, pg_dsn: str, tmp_path: Path
) -> None:
    """Each stack's journal is in its own database by default (issue 37: both used the
    database dlrover_tansu, and the second stack started with the first one's topics,
    records and offsets)."""
    other_db = f"dle_own_{uuid.uuid4().hex[:8]}"
    await _admin(pg_dsn, f"CREATE DATABASE {quote_ident(other_db)}")
    other_pg = with_database(pg_dsn, other_db)
    envs = {own_pg: unique_env("sa"), other_pg: unique_env("sb")}

    def environ(pg: str) -> dict[str, str]:
        env = up_environ(pg, tmp_path / envs[pg], DLROVER_EVENTS_DEFAULT_ENV=envs[pg])
        del env["DLROVER_EVENTS_BROKER_STORAGE"]  # the default: a journal in Postgres
        return env

    async def run(pg: str, publish_too: bool) -> set[str]:
        """The topics the stack's broker has at start; then some records of its own."""
        up = Up(environ(pg), "-s", "archiver")
        try:
            await up.started()
            assert f"schema broker_journal, of the stack of database {urlsplit(pg).path[1:]} " in (
                up.stderr
            ), up.stderr
            servers = re.findall(r"127\.0\.0\.1:\d+", up.stdout)[0]
            found = set(await topics_of(servers))
            if publish_too:
                await publish_events(Settings(bootstrap_servers=servers), envs[pg], 5)
        finally:
            rc = await up.stop()
        assert rc == 0, up.stderr
        return found

    try:
        await run(own_pg, publish_too=True)
        seen_by_b = await run(other_pg, publish_too=True)
        assert not {t for t in seen_by_b if t.startswith(envs[own_pg])}, seen_by_b
        seen_by_a = await run(own_pg, publish_too=False)
        assert f"{envs[own_pg]}.job.events" in seen_by_a, "its own history is back"
        assert not {t for t in seen_by_a if t.startswith(envs[other_pg])}, seen_by_a
    finally:
        await _admin(pg_dsn, f"DROP DATABASE IF EXISTS {quote_ident(other_db)} WITH (FORCE)")


async def topics_of(servers: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    await admin.start()
    try:
        return list(await admin.list_topics())
    finally:
        await admin.close()
