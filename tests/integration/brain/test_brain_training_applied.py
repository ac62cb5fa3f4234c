"""The brain on the real broker and Postgres takes training knobs from the job's own
training.applied on job.events, never from a ScaleResult, and does not ask again for
knobs that an accepted plan left awaiting the job's confirmation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import SCALE_PLANS, topic
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from schemas.jobs import JobMeta, JobStarted, NodeOOM, NodeRef, OOMKind
from schemas.plans import NotApplied, ScalePlan, ScaleResult, ScaleStatus, TrainingApplied
from streams.brain.core.state import JobState
from streams.brain.runtime.app import Brain
from tests.conftest import EnvFactory
from tests.integration.brain.workload import T0, plans_on, sample, submitted

pytestmark = pytest.mark.integration

AWAITING = "awaiting the job's confirmation (training.applied)"

T = TypeVar("T")


async def poll(check: Callable[[], Awaitable[T | None]], what: str, timeout_s: float = 60) -> T:
    """``check()`` once it is not None (it reads the broker or the database)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (found := await check()) is None:
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)
    return found


def gpu_oom(env: str, job: JobMeta, at_s: float) -> NodeOOM:
    return NodeOOM(
        env=env,
        job=job,
        occurred_at=T0 + timedelta(seconds=at_s),
        node=NodeRef(type="worker", id=0),
        kind=OOMKind.GPU_MEMORY,
        exit_code=1,
    )


async def state_of(pg_dsn: str, env: str) -> JobState | None:
    async with await EnvStore.open(pg_dsn, env) as store:
        rows = await store.fetch("SELECT state::text AS s FROM job_states")
    return JobState.model_validate_json(rows[0]["s"]) if rows else None


async def test_knobs_come_from_the_jobs_confirmation(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    job = JobMeta(uuid="job-knobs")
    brain = Brain(settings, env, pg_dsn, checkpoint_every_s=0.2)
    await brain.start()
    try:
        async with Producer(settings) as producer:
            await producer.publish_many(
                [
                    submitted(env, job, workers=2),
                    JobStarted(env=env, job=job, occurred_at=T0),
                    *(sample(env, job, i, workers=2) for i in range(3)),
                    gpu_oom(env, job, 60),
                ]
            )

            async def knob_plans() -> list[ScalePlan] | None:
                found = [
                    p
                    for p in await plans_on(settings, topic(env, SCALE_PLANS))
                    if isinstance(p, ScalePlan) and p.training
                ]
                return found or None

            (first,) = await poll(knob_plans, "the gpu-oom ScalePlan")
            assert first.training == {"local_batch_size": 32, "accumulation_steps": 2}

            await producer.publish(
                ScaleResult(
                    env=env,
                    job=job,
                    occurred_at=T0 + timedelta(seconds=61),
                    plan_id=first.plan_id,
                    status=ScaleStatus.PARTIAL,
                    not_applied=[
                        NotApplied(part=f"training.{k}", reason=AWAITING) for k in first.training
                    ],
                )
            )

            async def awaiting() -> JobState | None:
                state = await state_of(pg_dsn, env)
                ok = state is not None and state.awaiting_training is not None
                return state if ok else None

            state = await poll(awaiting, "the knobs awaiting confirmation")
            assert state.training["local_batch_size"] == 64  # the job's samples said so
            assert state.awaiting_training is not None
            assert state.awaiting_training.plan_id == first.plan_id

            # Another GPU OOM before the job confirmed: the same knobs are not asked again.
            await producer.publish(gpu_oom(env, job, 70))
            await producer.publish(
                TrainingApplied(
                    env=env,
                    job=job,
                    occurred_at=T0 + timedelta(seconds=80),
                    plan_id=first.plan_id,
                    node=NodeRef(type="worker", id=0),
                    training=first.training,
                    global_step=30,
                )
            )

            async def confirmed() -> JobState | None:
                state = await state_of(pg_dsn, env)
                if state is None or state.awaiting_training is not None:
                    return None
                return state if state.training == first.training else None

            state = await poll(confirmed, "the knobs confirmed")
    finally:
        await brain.stop()
    assert (await knob_plans()) == [first], "no second plan for the same knobs"
