"""A running brain takes `env settings` without a restart: a limit changed by the CLI
changes the next plan it makes; a cluster scheduler turned on makes it the env's leader
and its rounds plan the jobs, turned off again the per-job optimizers answer.

The brain runs as `up` runs it (the service in this loop), the CLI in its own process;
real broker, real Postgres.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import SCALE_PLANS, topic
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from schemas.env_settings import BrainSettings, LimitSettings
from schemas.jobs import JobMeta, JobStarted
from schemas.plans import ScalePlan
from streams.brain.core.optimizers.numeric import GiB
from streams.brain.core.policy import Policy
from streams.brain.core.triggers import step
from streams.brain.runtime.app import service
from tests.conftest import run_cli, unique_env
from tests.integration.brain.workload import (
    oom,
    plans_on,
    scheduled_job,
    scheduler_leaders,
    submitted,
    wait_for,
)

pytestmark = pytest.mark.integration


def _oom_job(env: str, uuid: str) -> list[object]:
    job = JobMeta(uuid=uuid)
    return [submitted(env, job), JobStarted(env=env, job=job), oom(env, job, 1, node=0)]


def _memory(plan: ScalePlan) -> int:
    (migrate,) = plan.migrate_nodes
    return migrate.resource.memory


def _expected_memory(env: str, uuid: str, policy: Policy) -> int:
    """What the pure core plans for the job's OOM under `policy`: the oracle."""
    state = None
    for event in _oom_job(env, uuid):
        out = step(state, event, policy)  # type: ignore[arg-type]
        assert out is not None
        state = out.state
    assert out.scale_plan is not None
    return _memory(out.scale_plan)


async def _scale_plan(settings: Settings, env: str, uuid: str) -> ScalePlan:
    found: list[ScalePlan] = []

    async def look() -> None:
        found[:] = [
            p
            for p in await plans_on(settings, topic(env, SCALE_PLANS))
            if isinstance(p, ScalePlan) and p.job.uuid == uuid
        ]

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 90
    await look()
    while not found:
        assert loop.time() < deadline, f"no ScalePlan for {uuid}"
        await asyncio.sleep(0.2)
        await look()
    return found[-1]


@pytest.fixture
async def running_brain(settings: Settings, pg_dsn: str) -> AsyncIterator[ServiceContext]:
    registry = EnvRegistry(settings, pg_dsn)
    env = unique_env("ls")
    await registry.create(env, partitions=2)
    ctx = ServiceContext(settings, env, pg_dsn)
    task = asyncio.create_task(service.run(ctx))
    try:
        async with asyncio.timeout(60):
            await ctx.ready.wait()
        yield ctx
    finally:
        ctx.stop.set()
        async with asyncio.timeout(60):
            await task  # a clean stop
        await registry.delete(env, force=True)


async def _set(settings: Settings, pg_dsn: str, env: str, *args: str) -> None:
    code, out, err = await run_cli(settings, pg_dsn, "env", "settings", env, *args)
    assert code == 0, (out, err)


async def test_a_limit_changed_by_the_cli_changes_the_next_plan(
    settings: Settings, pg_dsn: str, running_brain: ServiceContext, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="streams.brain.runtime.live_policy")
    env = running_brain.env
    before, after = Policy(), Policy(BrainSettings(limits=LimitSettings(max_memory_step=GiB)))
    want_before = _expected_memory(env, "job-before", before)
    want_after = _expected_memory(env, "job-after", after)
    assert want_before != want_after  # (else the test could not tell)

    async with Producer(settings) as producer:
        await producer.publish_many(_oom_job(env, "job-before"))  # type: ignore[arg-type]
    assert _memory(await _scale_plan(settings, env, "job-before")) == want_before

    await _set(settings, pg_dsn, env, "--set", f"brain.limits.max_memory_step={GiB}")
    taken = f"env {env}: its brain decides with settings version 2 from now on"
    await wait_for(lambda: taken in caplog.text, 60, "the brain to take the settings")

    async with Producer(settings) as producer:
        await producer.publish_many(_oom_job(env, "job-after"))  # type: ignore[arg-type]
    assert _memory(await _scale_plan(settings, env, "job-after")) == want_after
    assert not running_brain.stop.is_set()


async def test_a_scheduler_turned_on_and_off_regroups_the_running_brain(
    settings: Settings, pg_dsn: str, running_brain: ServiceContext
) -> None:
    env = running_brain.env
    assert await scheduler_leaders(pg_dsn, env) == []
    leading = running_brain.metrics.get_sample_value(
        "dlrover_events_brain_scheduler_leader", {"env": env}
    )
    assert leading is None

    scheduler = "{name: goodput-cluster, nodes: 2, gpus_per_node: 4}"
    await _set(settings, pg_dsn, env, "--set", f"brain.scheduler={scheduler}")

    async def leaders() -> list[str]:
        return await scheduler_leaders(pg_dsn, env)

    found: list[str] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while not found:
        assert loop.time() < deadline, "the brain did not take the scheduler leader lock"
        await asyncio.sleep(0.2)
        found = await leaders()
    async with Producer(settings) as producer:
        await producer.publish_many(scheduled_job(env, "job-scheduled", 0))
    plan = await _scale_plan(settings, env, "job-scheduled")
    assert plan.source_plan  # a round's plan, with its OptimizePlan

    await _set(settings, pg_dsn, env, "--unset", "brain.scheduler")
    deadline = loop.time() + 60
    while await leaders():
        assert loop.time() < deadline, "the brain kept the leader lock with no scheduler"
        await asyncio.sleep(0.2)
    async with Producer(settings) as producer:
        await producer.publish_many(_oom_job(env, "job-per-job"))  # type: ignore[arg-type]
    plan = await _scale_plan(settings, env, "job-per-job")
    assert _memory(plan) == _expected_memory(env, "job-per-job", Policy())
    assert not running_brain.stop.is_set()
