"""One allocator per env: of several brain instances of an env with a cluster scheduler,
one leads (holds the env's leader lock and every input partition), the others stand by
and take over when it dies; a leader that loses its lock stops deciding at once.

Real Postgres, a real broker, real brain processes killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import asyncpg
import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import BRAIN_PLANS, SCALE_PLANS, topic
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from schemas import encode
from schemas.plans import ScalePlan
from streams.brain.runtime.app import service
from streams.brain.runtime.leader import APP_PREFIX, LOCK_CLASS, Leadership, Role
from tests.conftest import REPO, cli_environ, unique_env
from tests.integration.brain.workload import plans_on, scheduled_job, scheduler_leaders, wait_for

pytestmark = pytest.mark.integration

#: the env's settings that make it scheduled by one allocator
SCHEDULED = {"brain": {"scheduler": {"name": "goodput-cluster", "nodes": 2, "gpus_per_node": 4}}}
#: the standby's poll (and the leader's check of its lock), short for the test
POLL_S = 0.5


async def _end_leader_session(pg_dsn: str, env: str) -> None:
    """What a Postgres restart or a lost network does to the leader's lock: its session
    ends (the process itself goes on)."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        ended = await conn.fetchval(
            "SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l WHERE"
            " l.locktype = 'advisory' AND l.granted AND l.classid = $1::int::oid"
            " AND l.objid = hashtext($2)::oid AND l.objsubid = 2",
            LOCK_CLASS,
            env,
        )
    finally:
        await conn.close()
    assert ended == 1


async def _submit(settings: Settings, env: str, uuid: str, at_s: float) -> None:
    async with Producer(settings) as producer:
        await producer.publish_many(scheduled_job(env, uuid, at_s))


async def _plans(settings: Settings, env: str) -> dict[str, set[str]]:
    """Each plan id with the bodies published under it."""
    out: dict[str, set[str]] = {}
    for name in (BRAIN_PLANS, SCALE_PLANS):
        for plan in await plans_on(settings, topic(env, name)):
            out.setdefault(plan.plan_id, set()).add(encode(plan).decode())
    return out


async def _wait_plan(settings: Settings, env: str, uuid: str, what: str) -> None:
    """Until the scheduler's ScalePlan for job `uuid` is published."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 90
    while True:
        plans = await plans_on(settings, topic(env, SCALE_PLANS))
        if any(isinstance(p, ScalePlan) and p.job.uuid == uuid for p in plans):
            return
        assert loop.time() < deadline, f"no plan {what}"


@pytest.fixture
async def scheduled_env(settings: Settings, pg_dsn: str) -> AsyncIterator[str]:
    registry = EnvRegistry(settings, pg_dsn)
    env = unique_env("l")
    await registry.create(env, partitions=3, settings=SCHEDULED)
    yield env
    await registry.delete(env, force=True)


@dataclass
class BrainProcess:
    """`dlrover-events brain --env E` in its own process, its output collected."""

    proc: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    @property
    def app_name_part(self) -> str:
        return f"pid {self.proc.pid}"

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.lines.append(line.decode(errors="replace").rstrip())


async def _start_brain(settings: Settings, pg_dsn: str, env: str) -> BrainProcess:
    environ = {**cli_environ(settings, pg_dsn), "DLROVER_EVENTS_FENCE_CHECK_S": str(POLL_S)}
    script = "import typer; from streams.brain.runtime.app import brain; typer.run(brain)"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        "--env",
        env,
        cwd=REPO,
        env=environ,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    brain = BrainProcess(proc)
    brain.reader = asyncio.create_task(brain._read())
    return brain


async def _end(brain: BrainProcess) -> None:
    if brain.proc.returncode is None:
        brain.proc.kill()
    await brain.proc.wait()
    if brain.reader is not None:
        await brain.reader


async def test_one_of_two_brain_processes_leads_and_the_other_takes_over_when_it_is_killed(
    settings: Settings, pg_dsn: str, scheduled_env: str
) -> None:
    env = scheduled_env
    brains = [await _start_brain(settings, pg_dsn, env) for _ in range(2)]
    try:
        # both start: one leads, the other says it stands by
        await wait_for(
            lambda: any(b.said("standby;") for b in brains),
            timeout_s=60,
            what="a brain to stand by",
        )
        (holder,) = await scheduler_leaders(pg_dsn, env)
        assert holder.startswith(f"{APP_PREFIX} {env} ")
        (leader,) = [b for b in brains if holder.endswith(b.app_name_part)]
        (standby,) = [b for b in brains if b is not leader]
        assert standby.said(f"standby; {holder.removeprefix(f'{APP_PREFIX} {env} ')} is")
        assert not leader.said("standby;")

        await _submit(settings, env, "job-before", at_s=1)
        await _wait_plan(settings, env, "job-before", "from the leader")

        leader.proc.send_signal(signal.SIGKILL)
        await leader.proc.wait()
        assert leader.proc.returncode == -signal.SIGKILL
        await _submit(settings, env, "job-after", at_s=121)
        await _wait_plan(settings, env, "job-after", "for a job submitted after the leader died")
        (holder,) = await scheduler_leaders(pg_dsn, env)
        assert holder.endswith(standby.app_name_part)
        assert standby.said("the env's scheduler leader; joining")

        plans = await _plans(settings, env)
        twice = {p: bodies for p, bodies in plans.items() if len(bodies) > 1}
        assert twice == {}, "plan ids published with different bodies"

        standby.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await standby.proc.wait()
        assert standby.proc.returncode == 0, "\n".join(standby.lines)
    finally:
        for brain in brains:
            await _end(brain)


class _Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def said() -> Iterator[_Said]:
    handler = _Said()
    logger = logging.getLogger("streams.brain.runtime.leader")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


async def test_a_leader_whose_lock_session_ends_stops_deciding_and_leads_again(
    settings: Settings, pg_dsn: str, scheduled_env: str, said: _Said
) -> None:
    env = scheduled_env
    conf = settings.model_copy(update={"fence_check_s": POLL_S})
    ctx = ServiceContext(conf, env, pg_dsn)
    task = asyncio.create_task(service.run(ctx))

    def leading() -> float | None:
        return ctx.metrics.get_sample_value("dlrover_events_brain_scheduler_leader", {"env": env})

    try:
        async with asyncio.timeout(60):
            await ctx.ready.wait()
        (holder,) = await scheduler_leaders(pg_dsn, env)
        assert holder.endswith(f"pid {os.getpid()}")
        assert leading() == 1.0
        await _submit(settings, env, "job-first", at_s=1)
        await _wait_plan(settings, env, "job-first", "from the leader")

        await _end_leader_session(pg_dsn, env)
        await wait_for(
            lambda: any("lost the scheduler leader lock" in m for m in said.messages),
            timeout_s=30,
            what="the leader to see its lock lost",
        )
        # alone, it takes the lock again (a second "leader" line) and goes on deciding
        await wait_for(
            lambda: sum("the env's scheduler leader;" in m for m in said.messages) == 2,
            timeout_s=30,
            what="the brain to lead again",
        )
        await _submit(settings, env, "job-second", at_s=121)
        await _wait_plan(settings, env, "job-second", "after leading again")
        assert not task.done()
    finally:
        ctx.stop.set()
        async with asyncio.timeout(30):
            await task  # a clean stop
    assert await scheduler_leaders(pg_dsn, env) == [], "a stopped brain gives the lock back"
    assert leading() == 0.0


async def test_an_env_without_a_scheduler_takes_no_leader_lock(
    settings: Settings, pg_dsn: str
) -> None:
    registry = EnvRegistry(settings, pg_dsn)
    env = unique_env("l")
    await registry.create(env, partitions=2)
    ctx = ServiceContext(settings, env, pg_dsn)
    task = asyncio.create_task(service.run(ctx))
    try:
        async with asyncio.timeout(60):
            await ctx.ready.wait()
        assert await scheduler_leaders(pg_dsn, env) == []
    finally:
        ctx.stop.set()
        async with asyncio.timeout(30):
            await task
        await registry.delete(env, force=True)


async def test_a_standby_takes_the_lock_once_the_leaders_session_ends(pg_dsn: str) -> None:
    env = unique_env("l")
    first, second = (Leadership(pg_dsn, env, poll_s=POLL_S) for _ in range(2))
    stop = asyncio.Event()
    try:
        assert await first.acquire(stop)
        assert first.role is Role.LEADER
        taking = asyncio.create_task(second.acquire(stop))
        async with asyncio.timeout(30):
            await second.standing_by.wait()
        assert not taking.done()

        await _end_leader_session(pg_dsn, env)
        async with asyncio.timeout(30):
            await first.lost.wait()
            assert await taking
        assert first.reason is not None
        assert second.role is Role.LEADER and not second.lost.is_set()
        (holder,) = await scheduler_leaders(pg_dsn, env)
        assert holder.startswith(f"{APP_PREFIX} {env} ")
    finally:
        stop.set()
        await first.release()
        await second.release()
    assert await scheduler_leaders(pg_dsn, env) == []


async def test_a_standby_told_to_stop_gives_up_waiting(pg_dsn: str) -> None:
    env = unique_env("l")
    leader, standby = (Leadership(pg_dsn, env, poll_s=POLL_S) for _ in range(2))
    stop = asyncio.Event()
    try:
        assert await leader.acquire(asyncio.Event())
        waiting = asyncio.create_task(standby.acquire(stop))
        async with asyncio.timeout(30):
            await standby.standing_by.wait()
        stop.set()
        async with asyncio.timeout(30):
            assert await waiting is False
        assert standby.role is Role.STANDBY
    finally:
        await leader.release()
        await standby.release()
