"""The plan follower against the real gateway (GET /v1/jobs/{job}/plan) on the real broker:
404 before the gateway knows the job, then the plan; the knobs switch at a step boundary,
the job's TrainingApplied goes through the bus back to the gateway, and the plan it then
serves has nothing left to apply: the closed loop, from the training side."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.runtime.embedded import free_port
from dlrover_events.sdk import JobIdentity, Reporter
from dlrover_events.sdk.follow_plan import PlanFollower
from dlrover_events.sdk.knobs import BatchKnobs, StepKnobs
from dlrover_events.settings import Settings
from schemas.jobs import JobMeta, JobSubmitted, RoleSpec
from schemas.plans import NotApplied, ScalePlan, ScaleResult, ScaleStatus
from tests.integration.gateway.conftest import Running, gw

pytestmark = pytest.mark.integration

__all__ = ["gw"]  # the gateway fixture, used by name


async def until(what: str, cond: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_the_follower_closes_the_loop_through_the_gateway(
    gw: Running, settings: Settings
) -> None:
    env = gw.env
    job = JobMeta(uuid=f"follow-{uuid.uuid4().hex[:8]}", name="follow", user="u1")
    follower = PlanFollower(job.uuid, url=gw.url, token=gw.read, wait_s=5).start()
    identity = JobIdentity(job=job, env=env, rank=1)
    reporter = Reporter(identity, settings=settings, interval_s=0.2)
    await asyncio.to_thread(reporter.start)
    knobs = StepKnobs(16, 1, reporter=reporter).follow(follower)
    try:
        # The gateway has not seen the job: 404, no plan, no outage.
        await until("a first answer", lambda: follower.snapshot().error != "not fetched yet")
        assert follower.current() is None

        async with Producer(settings, linger_ms=0) as producer:
            await producer.publish_many(
                [
                    JobSubmitted(env=env, job=job, roles={"worker": RoleSpec(replicas=2)}),
                    ScalePlan(env=env, job=job, plan_id="s1", training={"local_batch_size": 4}),
                    ScaleResult(
                        env=env,
                        job=job,
                        plan_id="s1",
                        status=ScaleStatus.PARTIAL,
                        not_applied=[
                            NotApplied(part="training.local_batch_size", reason="the job's")
                        ],
                    ),
                ]
            )
        await until("the knobs offered", lambda: knobs._pending is not None)
        plan = follower.current()
        assert plan is not None and plan.knobs_to_apply() == ("s1", {"local_batch_size": 4})

        assert knobs.at_step_boundary(99) is not None  # the training loop's boundary
        assert knobs.knobs == BatchKnobs(4, 4)
        assert await asyncio.to_thread(reporter.flush, 10.0)

        # The confirmation goes round: the gateway now serves it, nothing left to apply.
        def confirmed() -> bool:
            p = follower.current()
            return p is not None and p.training_applied is not None

        await until("the gateway to serve the confirmation", confirmed)
        plan = follower.current()
        assert plan is not None and plan.training_applied is not None
        assert plan.training_applied.plan_id == "s1"
        assert plan.training_applied.global_step == 100
        assert plan.knobs_to_apply() is None
        assert knobs._pending is None
    finally:
        follower.close()
        await asyncio.to_thread(reporter.close, 1.0)


async def test_a_wrong_token_is_an_outage_not_an_error(gw: Running) -> None:
    follower = PlanFollower("any-job", url=gw.url, token="dle.wrong", wait_s=1).start()
    try:
        await until("an answer", lambda: follower.snapshot().error != "not fetched yet")
        assert follower.current() is None
        assert "401" in (follower.snapshot().error or "")
    finally:
        follower.close()
    # And a gateway that is not there at all.
    nowhere = PlanFollower("any-job", url=f"http://127.0.0.1:{free_port()}", token="t").start()
    try:
        await until("an answer", lambda: nowhere.snapshot().error != "not fetched yet")
        assert nowhere.current() is None
    finally:
        nowhere.close()
