"""A config document that targets a user matches that user's TrainingJob on the cluster.

Real parts: the kube-apiserver (the job and its pods), the env's reconciler, the env's
brain as `up` runs it, and a document on the env's config.changes as the gateway
publishes one. The job says who it is by its labels (dlrover-events.io/user); the brain
routes alice's job by alice's document, and bob's by the defaults.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import BRAIN_PLANS, JOB_EVENTS, SCALE_PLANS, SCALE_RESULTS
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from schemas.config import ConfigChange, ConfigDocument
from schemas.jobs import JobSubmitted
from schemas.plans import OptimizePlan, ScaleResult, ScaleStatus
from streams.brain.runtime.app import service as brain_service
from tests.integration.tap import Tap

from .test_elastic_jobs import create_job
from .test_reconciler_support import DEADLINE_S, Cluster, role, until

pytestmark = pytest.mark.integration

OPTIMIZER = "ps-cold-create"


@pytest.fixture
async def bus(settings: Settings, env: str) -> AsyncIterator[Tap]:
    b = Tap(settings, env, (JOB_EVENTS, BRAIN_PLANS, SCALE_PLANS, SCALE_RESULTS))
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


@pytest.fixture
async def alices_document(settings: Settings, env: str) -> None:
    """``Include: {User: alice}``: three parameter servers for her jobs (the optimizer's
    default is four), published before the brain starts, as a document stored earlier."""
    doc = ConfigDocument(
        name="alice-ps",
        version=1,
        include={"User": "alice"},
        configure={"optimizer": OPTIMIZER, "optimizer_params": {OPTIMIZER: {"replicas": 3}}},
    )
    async with Producer(settings) as producer:
        await producer.publish(
            ConfigChange(env=env, op="upsert", name=doc.name, version=1, document=doc)
        )


@pytest.fixture
async def brain(
    settings: Settings, pg_dsn: str, env: str, alices_document: None
) -> AsyncIterator[ServiceContext]:
    ctx = ServiceContext(settings, env, pg_dsn)
    task = asyncio.create_task(brain_service.run(ctx))
    ready = asyncio.create_task(ctx.ready.wait())
    await asyncio.wait([task, ready], timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED)
    try:
        if not ready.done():
            ready.cancel()
            if task.done():
                task.result()
            pytest.fail(f"the brain of {env} was not ready within {DEADLINE_S:.0f}s")
        yield ctx
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, DEADLINE_S)


def ps_job() -> dict[str, object]:
    return {"worker": role(2), "ps": role(1)}


async def test_a_document_for_alice_routes_alices_cluster_job(
    cluster: Cluster, env: str, bus: Tap, brain: ServiceContext
) -> None:
    await cluster.start(env)
    alice = await create_job(cluster, ps_job(), {"dlrover-events.io/user": "alice"})
    bob = await create_job(cluster, ps_job(), {"dlrover-events.io/user": "bob"})
    plans = {}
    for name, user in ((alice, "alice"), (bob, "bob")):
        job = await cluster.job(name)
        assert job is not None
        (sub,) = await bus.until(lambda u=job.uid: bus.of(JobSubmitted, u), "job.submitted")
        assert sub.job.user == user
        plans[user] = await bus.first(OptimizePlan, job.uid, lambda p: True, f"{user}'s plan")
    assert plans["alice"].optimizer == OPTIMIZER
    assert plans["alice"].resource.node_group_resources["ps"].count == 3  # her document
    assert plans["bob"].resource.node_group_resources["ps"].count == 4  # the default

    # ... and the operator applies what her document made of her plan.
    alice_uid = plans["alice"].job.uuid
    result = await bus.first(
        ScaleResult, alice_uid, lambda r: r.status is ScaleStatus.APPLIED, "alice's result"
    )
    assert "ps 1->3" in result.reason

    async def three_ps() -> bool:
        pods = await cluster.pods(alice, role="ps")
        return len(pods) == 3 and all(p.running for p in pods)

    await until(three_ps, "alice's 3 running parameter servers")
