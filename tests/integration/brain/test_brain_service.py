"""The brain as `up` runs it (a service in the caller's event loop) and as `dlrover-events
brain --env E` runs it (its own process, stopped by SIGTERM)."""

from __future__ import annotations

import asyncio
import signal
import sys

import asyncpg
import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import SCALE_PLANS, topic
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from schemas.jobs import JobMeta, JobStarted
from schemas.plans import ScalePlan
from streams.brain.core.planner import plan_id
from streams.brain.runtime.app import Brain, service
from tests.conftest import REPO, EnvFactory, cli_environ, unique_env
from tests.integration.brain.workload import oom, plans_on, submitted

pytestmark = pytest.mark.integration


async def _publish_oom_job(settings: Settings, env: str, uuid: str) -> str:
    job = JobMeta(uuid=uuid)
    the_oom = oom(env, job, 1, node=0)
    async with Producer(settings) as producer:
        await producer.publish_many([submitted(env, job), JobStarted(env=env, job=job), the_oom])
    return plan_id(uuid, str(the_oom.event_id), "scale")


async def _scale_plan_ids(settings: Settings, env: str) -> set[str]:
    return {
        p.plan_id
        for p in await plans_on(settings, topic(env, SCALE_PLANS))
        if isinstance(p, ScalePlan)
    }


async def test_service_runs_in_the_callers_loop_and_stops_on_request(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    want = await _publish_oom_job(settings, env, "job-svc")
    ctx = ServiceContext(settings, env, pg_dsn)
    task = asyncio.create_task(service.run(ctx))
    try:
        async with asyncio.timeout(60):
            await ctx.ready.wait()
        async with await EnvStore.open(pg_dsn, env) as store:
            query = "SELECT plan_id FROM scale_plans"

            async def recorded() -> set[str]:
                return {r["plan_id"] for r in await store.fetch(query)}

            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while want not in await recorded():
                assert loop.time() < deadline, "no ScalePlan recorded"
                await asyncio.sleep(0.2)
    finally:
        ctx.stop.set()
        async with asyncio.timeout(30):
            await task  # a clean stop: no exception
    assert service.name == "brain"
    assert want in await _scale_plan_ids(settings, env)


async def test_command_runs_until_sigterm(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    want = await _publish_oom_job(settings, env, "job-cmd")
    environ = cli_environ(settings, pg_dsn)
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
    try:
        found: set[str] = set()

        async def look() -> None:
            found.update(await _scale_plan_ids(settings, env))

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while want not in found:
            assert proc.returncode is None, "the brain exited early"
            assert loop.time() < deadline, "no ScalePlan from the command"
            await look()
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()


async def test_command_says_so_when_the_env_is_missing(settings: Settings, pg_dsn: str) -> None:
    environ = cli_environ(settings, pg_dsn)
    script = (
        "import sys, typer\n"
        "from dlrover_events.errors import UserError\n"
        "from streams.brain.runtime.app import brain\n"
        "try:\n"
        "    typer.run(brain)\n"
        "except UserError as e:\n"
        "    print(f'error: {e}'); sys.exit(2)\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        "--env",
        "nosuchenv",
        cwd=REPO,
        env=environ,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(60):
        out, _ = await proc.communicate()
    assert proc.returncode == 2, out.decode()
    assert "no env named 'nosuchenv'" in out.decode()  # the fence's one line


async def test_env_settings_choose_the_brains_policy(settings: Settings, pg_dsn: str) -> None:
    registry = EnvRegistry(settings, pg_dsn)
    good, bad = unique_env("b"), unique_env("b")
    await registry.create(good, settings={"brain": {"running_every": 20}})
    with pytest.raises(UserError, match=r"brain\.running_every"):  # refused at the door
        await registry.create(bad, settings={"brain": {"running_every": "often"}})
    await registry.create(bad)
    # settings the registry no longer takes, stored by an older version or by hand
    conn = await asyncpg.connect(pg_dsn)
    try:
        await conn.execute(
            "UPDATE dlrover.envs SET settings = $2::jsonb WHERE name = $1",
            bad,
            '{"brain": {"running_every": "often"}}',
        )
    finally:
        await conn.close()
    try:
        brain = Brain(settings, good, pg_dsn)
        await brain.start()
        try:
            assert brain.processor.policy.settings.running_every == 20
        finally:
            await brain.stop()
        with pytest.raises(UserError, match=r"brain\.running_every"):
            await Brain(settings, bad, pg_dsn).start()
    finally:
        for name in (good, bad):
            await registry.delete(name, force=True)
