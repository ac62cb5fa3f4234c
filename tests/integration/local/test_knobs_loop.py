"""Training knobs reach a running job on the local platform, with the real brain and the
real gateway: a GPU OOM makes the brain halve the micro-batch (accumulation doubled, the
global batch kept); the operator can only answer `partial` (the knobs are the job's to
apply); the job's SDK follows its plan at the gateway, switches at a step boundary and
confirms; the brain takes the knobs as in force only from that confirmation (the fold's
order is unit-tested in tests/unit/brain). A job that never confirms keeps its plan
`partial`, and the knobs never reach the brain's state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dlrover_events.settings import Settings
from handlers.gateway.runtime import GatewayServer, GatewaySettings
from schemas.jobs import JobSubmitted, NodeOOM, NodeRef, OOMKind, RuntimeSample
from schemas.plans import ScalePlan, ScaleResult, ScaleStatus, TrainingApplied
from streams.brain.runtime.app import Brain
from tests.integration.local.conftest import Local
from tests.integration.local.test_elastic_loop import ROOT, example_job, of_plan, wait_for
from tests.integration.local.test_local_platform import sleeper_job


@pytest.fixture
async def gateway(local: Local, settings: Settings) -> AsyncIterator[GatewayServer]:
    conf = GatewaySettings(host="127.0.0.1", port=0, pool_max=3, token_cache_s=0.5)
    async with GatewayServer(settings, local.env, local.pg_dsn, conf) as server:
        await server.wait_ready(60)
        yield server


@pytest.fixture
async def brain(local: Local, settings: Settings) -> AsyncIterator[Brain]:
    running = Brain(settings, local.env, local.pg_dsn, checkpoint_every_s=1.0)
    await running.start()
    yield running
    await running.stop()


def knobs(state: Any) -> dict[str, Any]:
    return {k: state.training.get(k) for k in ("local_batch_size", "accumulation_steps")}


async def test_a_gpu_oom_plan_changes_the_micro_batch_of_the_running_job(
    local: Local, gateway: GatewayServer, brain: Brain, tmp_path: Path
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "examples").symlink_to(ROOT / "examples")
    ctx, task = await local.start_operator(gateway_url=gateway.url)
    try:
        body = example_job("knobs", replicas=2)
        # At the planner's floor (min_cpu 4, min_memory 6 GiB): the brain's worker-resource
        # optimizer then asks for nothing, so no migration restarts the job while its knobs
        # plan is followed (since the brain plans only what the platform can apply, such a
        # migration of the other workers is applied, where it used to be rejected whole).
        body["spec"]["roles"]["worker"]["resources"] = {"cpu": 4, "memory": "6Gi"}
        job = await local.submit(body, workdir)
        uid = job.uid
        submitted = await local.tap.first(JobSubmitted, uid, lambda e: True, "job.submitted")
        await wait_for(
            "samples at world size 2, batch 16",
            lambda: [
                s
                for s in local.tap.of(RuntimeSample, uid)
                if s.world_size == 2 and s.local_batch_size == 16
            ],
        )
        await local.producer.publish(
            NodeOOM(
                env=local.env,
                job=submitted.job,
                node=NodeRef(type="worker", id=0),
                kind=OOMKind.GPU_MEMORY,
                gpu_memory=8 << 30,
            )
        )
        plan = await local.tap.first(
            ScalePlan, uid, lambda e: bool(e.training), "the brain's micro-batch plan"
        )
        assert plan.training == {"local_batch_size": 8, "accumulation_steps": 2}, plan
        result = await local.tap.first(ScaleResult, uid, of_plan(plan.plan_id), "its result")
        assert result.status == ScaleStatus.PARTIAL, result
        assert {p.part for p in result.not_applied} == {
            "training.local_batch_size",
            "training.accumulation_steps",
        }
        confirmed = await local.tap.first(
            TrainingApplied, uid, lambda e: e.plan_id == plan.plan_id, "the job's confirmation"
        )
        assert confirmed.training == plan.training
        # Rank 0 speaks for the job: one confirmation.
        await asyncio.sleep(2)
        assert len(local.tap.of(TrainingApplied, uid)) == 1
        # The samples from the switch on say the new knobs, at the same world size.
        await wait_for(
            "samples with the new knobs",
            lambda: [
                s
                for s in local.tap.of(RuntimeSample, uid)
                if s.local_batch_size == 8 and s.accumulation_steps == 2 and s.world_size == 2
            ],
        )
        state = await wait_for(
            "the brain's state with the knobs",
            lambda: (
                s
                if (s := brain.processor.states.get(uid)) is not None
                and knobs(s) == {"local_batch_size": 8, "accumulation_steps": 2}
                and s.awaiting_training is None
                else None
            ),
        )
        assert state.awaiting_training is None
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, 120)


async def test_knobs_a_job_never_confirms_stay_partial(
    local: Local, gateway: GatewayServer, brain: Brain
) -> None:
    ctx, task = await local.start_operator(gateway_url=gateway.url)
    try:
        # A job whose process has no SDK: nothing will ever confirm its knobs.
        job = await local.submit(sleeper_job("deaf", 1))
        uid = job.uid
        submitted = await local.tap.first(JobSubmitted, uid, lambda e: True, "job.submitted")
        plan = ScalePlan(
            env=local.env,
            job=submitted.job,
            plan_id="knobs-unheard",
            training={"local_batch_size": 4, "accumulation_steps": 4},
        )
        await local.producer.publish(plan)
        result = await local.tap.first(ScaleResult, uid, of_plan(plan.plan_id), "its result")
        assert result.status == ScaleStatus.PARTIAL
        await asyncio.sleep(5)
        assert not local.tap.of(TrainingApplied, uid)
        results = [r for r in local.tap.of(ScaleResult, uid) if r.plan_id == plan.plan_id]
        assert all(r.status == ScaleStatus.PARTIAL for r in results), results
        state = brain.processor.states.get(uid)
        assert state is not None
        assert state.training.get("local_batch_size") != 4
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, 120)
