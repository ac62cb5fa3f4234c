"""A cluster scheduler on a real platform gives out what the platform reports, not the
settings' static cluster: the operator's `cluster.capacity` report (a cordoned node's
GPUs are not the scheduler's) bounds every round, and a later report (the node back)
is taken by the running brain. Real broker, real Postgres."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import SCALE_PLANS, topic
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.settings import Settings
from schemas.cluster import CapacityReported, HostCapacity
from schemas.env_settings import BrainSettings, SchedulerSettings
from schemas.envelope import Event
from schemas.jobs import JobMeta
from schemas.plans import ScalePlan
from streams.brain.core.policy import Policy
from streams.brain.runtime.app import Brain
from tests.conftest import unique_env
from tests.integration.brain.workload import (
    T0,
    plans_on,
    scheduled_job,
    scheduled_sample,
    wait_for,
)

pytestmark = pytest.mark.integration

JOBS = ("cap-0", "cap-1", "cap-2")


def _report(env: str, *, b_schedulable: bool, at: datetime) -> CapacityReported:
    return CapacityReported(
        env=env,
        platform="kubernetes",
        occurred_at=at,
        hosts=[
            HostCapacity(name="gpu-a", gpus=2),
            HostCapacity(name="gpu-b", gpus=4, schedulable=b_schedulable),
        ],
    )


def _later_samples(env: str, uuid: str, from_s: float) -> list[Event]:
    """Reports that move the env's event time past two more scheduling intervals."""
    job = JobMeta(uuid=uuid, name=uuid)
    return [scheduled_sample(env, job, from_s + s) for s in (30, 61, 121)]


def _held_by_round(plans: list[ScalePlan]) -> dict[datetime, dict[str, dict[str, int]]]:
    """After each round (its plans' time): every job's placement as its latest plan set it."""
    held: dict[str, dict[str, int]] = {}
    out: dict[datetime, dict[str, dict[str, int]]] = {}
    for plan in sorted(plans, key=lambda p: p.occurred_at):
        held[plan.job.uuid] = {} if plan.suspend else dict(plan.placement)
        out[plan.occurred_at] = {job: dict(p) for job, p in held.items()}
    return out


async def test_rounds_give_out_the_reported_hosts_and_follow_a_new_report(
    settings: Settings, pg_dsn: str
) -> None:
    env = unique_env("cap")
    registry = EnvRegistry(settings, pg_dsn)
    await registry.create(env, partitions=2)
    # The settings' static cluster is far larger than what the platform reports: a round
    # that used it would hand out GPUs the cluster does not have.
    policy = Policy(
        BrainSettings(scheduler=SchedulerSettings(name="goodput-cluster", nodes=8, gpus_per_node=4))
    )
    try:
        async with Producer(settings) as producer:
            await producer.publish(_report(env, b_schedulable=False, at=T0))
            for i, uuid in enumerate(JOBS):
                await producer.publish_many(scheduled_job(env, uuid, i))
        brain = Brain(settings, env, pg_dsn, policy=policy, checkpoint_every_s=0.2)
        await brain.start()
        try:
            capacity = brain.processor.capacity
            assert capacity is not None  # read before the first round
            assert [(n.name, n.gpus) for n in capacity.nodes] == [("gpu-a", 2)]
            assert brain.processor.free_gpus() is not None

            async def scale_plans() -> list[ScalePlan]:
                return [
                    p
                    for p in await plans_on(settings, topic(env, SCALE_PLANS))
                    if isinstance(p, ScalePlan)
                ]

            first: list[ScalePlan] = []
            events = 3 * len(JOBS)

            async def decided_all() -> bool:
                first[:] = await scale_plans()
                c = brain.processor.counters
                return c.processed + c.ignored >= events and len(first) == c.scale_plans > 0

            await _wait_async(decided_all, "the brain to decide every event")
            rounds = _held_by_round(first)
            for at, held in rounds.items():
                used = {node for placement in held.values() for node in placement}
                assert used <= {"gpu-a"}, (at, held)
                assert sum(sum(p.values()) for p in held.values()) <= 2, (at, held)
            # three jobs, two GPUs: one of them waits
            assert sum(1 for p in rounds[max(rounds)].values() if p) <= 2

            # The cordoned node comes back: the running brain takes the new report and
            # its next rounds may use it; the waiting job is admitted.
            async with Producer(settings) as producer:
                await producer.publish(
                    _report(env, b_schedulable=True, at=T0 + timedelta(seconds=90))
                )
            await wait_for(
                lambda: (
                    brain.processor.capacity is not None
                    and brain.processor.capacity.total_gpus == 6
                ),
                60,
                "the brain to take the new report",
            )
            async with Producer(settings) as producer:
                for uuid in JOBS:
                    await producer.publish_many(_later_samples(env, uuid, 120))

            async def all_running() -> bool:
                rounds = _held_by_round(await scale_plans())
                last = rounds[max(rounds)]
                return len(last) == len(JOBS) and all(last.values())

            await _wait_async(all_running, "every job to hold GPUs on the larger cluster")
            for at, held in _held_by_round(await scale_plans()).items():
                assert sum(sum(p.values()) for p in held.values()) <= 6, (at, held)
        finally:
            await brain.stop()
    finally:
        await registry.delete(env, force=True)


async def _wait_async(
    check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 60.0
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)
