"""Jobs, events and waits shared by the brain's integration tests and its crash helper."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import asyncpg

from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.settings import Settings
from schemas import decode
from schemas.envelope import Event
from schemas.jobs import (
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeOOM,
    NodeRef,
    NodeUsage,
    OOMKind,
    RoleSpec,
    RuntimeSample,
)
from schemas.plans import OptimizePlan, ScalePlan
from streams.brain.core.optimizers.numeric import GiB
from streams.brain.core.policy import Policy
from streams.brain.core.triggers import step
from streams.brain.runtime.leader import LOCK_CLASS

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def submitted(env: str, job: JobMeta, workers: int = 4) -> JobSubmitted:
    role = RoleSpec(replicas=workers, min_replicas=1, max_replicas=8, cpu=8, memory=16 * GiB)
    return JobSubmitted(env=env, job=job, occurred_at=T0, roles={"worker": role}, batch_size=256)


def sample(
    env: str, job: JobMeta, i: int, workers: int = 4, memory_gib: float = 12
) -> RuntimeSample:
    return RuntimeSample(
        env=env,
        job=job,
        occurred_at=T0 + timedelta(seconds=15 * (i + 1)),
        global_step=10 * i,
        speed=1.0 + 0.01 * (i % 3),
        samples_per_s=256,
        batch_size=256,
        local_batch_size=64,
        nodes=[
            NodeUsage(
                type="worker",
                id=k,
                cpu=4 + 0.1 * k,
                memory=int(memory_gib * GiB),
                step_time=1.0 + 0.01 * k,
            )
            for k in range(workers)
        ],
    )


def oom(env: str, job: JobMeta, i: int, node: int) -> NodeOOM:
    return NodeOOM(
        env=env,
        job=job,
        occurred_at=T0 + timedelta(seconds=15 * (i + 1)),
        node=NodeRef(type="worker", id=node),
        kind=OOMKind.HOST_MEMORY,
        memory=16 * GiB,
        exit_code=137,
    )


def job_events(env: str, job: JobMeta, count: int, oom_every: int = 7) -> list[Event]:
    """A job that trains and runs out of host memory now and then, on rotating nodes."""
    out: list[Event] = [submitted(env, job), JobStarted(env=env, job=job, occurred_at=T0)]
    for i in range(count):
        if i % oom_every == oom_every - 1:
            out.append(oom(env, job, i, (i // oom_every) % 4))
        else:
            out.append(sample(env, job, i))
    return out


def expected_plans(
    events: Sequence[Event], policy: Policy | None = None
) -> tuple[set[str], set[str]]:
    """The plan ids of an uninterrupted brain over `events` in this order (per job): the
    pure core, without broker or database, is the oracle."""
    policy = policy or Policy()
    states: dict[str, object] = {}
    optimize: set[str] = set()
    scale: set[str] = set()
    for event in events:
        assert event.key is not None
        out = step(states.get(event.key), event, policy)  # type: ignore[arg-type]
        assert out is not None
        states[event.key] = out.state
        if out.optimize_plan is not None:
            optimize.add(out.optimize_plan.plan_id)
        if out.scale_plan is not None:
            scale.add(out.scale_plan.plan_id)
    return optimize, scale


async def plans_on(settings: Settings, topic_name: str) -> list[OptimizePlan | ScalePlan]:
    out: list[OptimizePlan | ScalePlan] = []
    for record in await read_topic(settings, topic_name, timeout_s=10):
        event = decode(record.value)
        assert isinstance(event, OptimizePlan | ScalePlan), event
        out.append(event)
    return out


async def wait_for(check: Callable[[], bool], timeout_s: float = 60.0, what: str = "") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.05)


def scheduled_job(env: str, uuid: str, at_s: float) -> list[Event]:
    """A job submitted at `at_s` that reports twice: the second report's event time
    passes a multiple of the scheduler's interval (60 s), and its round plans the job."""
    job = JobMeta(uuid=uuid, name=uuid)
    out: list[Event] = [
        JobSubmitted(
            env=env,
            job=job,
            occurred_at=T0 + timedelta(seconds=at_s),
            application="cifar10",
            batch_size=64,
            max_batch_size=512,
            min_local_batch_size=8,
            max_local_batch_size=128,
            adaptive_batch_size=True,
            roles={"worker": RoleSpec(replicas=1, gpu_num=1, memory=4 * GiB)},
        )
    ]
    out.extend(scheduled_sample(env, job, at_s + after_s) for after_s in (29, 60))
    return out


def scheduled_sample(env: str, job: JobMeta, at_s: float) -> RuntimeSample:
    """A report of a scheduled job on one worker at `at_s` of the workload's time."""
    return RuntimeSample(
        env=env,
        job=job,
        occurred_at=T0 + timedelta(seconds=at_s),
        global_step=int(at_s),
        speed=2.0,
        batch_size=64,
        local_batch_size=64,
        world_size=1,
        num_nodes=1,
        allreduce_s=0.0,
        grad_sqr=1.0,
        grad_var=64.0,
        nodes=[NodeUsage(type="worker", id=0, memory=3 * GiB)],
    )


async def scheduler_leaders(pg_dsn: str, env: str) -> list[str]:
    """application_name of every session holding the env's leader lock."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        rows = await conn.fetch(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.granted AND l.classid = $1::int::oid"
            " AND l.objid = hashtext($2)::oid AND l.objsubid = 2",
            LOCK_CLASS,
            env,
        )
    finally:
        await conn.close()
    return [r["application_name"] for r in rows]
