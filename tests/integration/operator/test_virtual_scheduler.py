"""A virtual operator whose env's brain owns admission, on the real broker and Postgres:
jobs start only on a plan that gives them replicas, on the nodes it names; a suspend stops
a job's pods and frees its GPUs for another; samples carry what a cluster scheduler fits."""

from __future__ import annotations

from typing import Any

import pytest

from handlers.simulator.job import AWAITING_RESUME, AWAITING_SCHEDULER, TERMINATED_EXIT_CODE
from schemas.jobs import NodeExited, NodeStarted, RuntimeSample
from schemas.plans import NodeGroupResource, ScaleResult, ScaleStatus
from tests.integration.operator.conftest import Sim

pytestmark = pytest.mark.integration


async def answer(sim: Sim, job: str, plan_id: str, **fields: Any) -> ScaleResult:
    await sim.producer.publish(sim.plan(job, plan_id, **fields))
    (result,) = await sim.tap.until(
        lambda: [r for r in sim.tap.of(ScaleResult) if r.plan_id == plan_id] or None, plan_id
    )
    return result


def workers(count: int) -> dict[str, NodeGroupResource]:
    return {"worker": NodeGroupResource(count=count)}


async def test_under_the_brains_admission_plans_start_place_and_suspend_jobs(sim: Sim) -> None:
    await sim.start(admission="brain")
    await sim.submit("job-a")
    await sim.submit("job-b")
    admitted = await answer(
        sim, "job-b", "b-admit", node_group_resources=workers(4), placement={"node-2": 4}
    )
    assert admitted.status is ScaleStatus.APPLIED, admitted.reason
    assert admitted.observed["worker"]["running"] == 4
    sample = await sim.tap.until(
        lambda: next(iter(sim.tap.of(RuntimeSample, "job-b")), None), "job-b's sample"
    )
    assert (sample.world_size, sample.num_nodes) == (4, 1)
    assert sample.grad_sqr is not None and sample.grad_var is not None
    assert sample.compute_s is not None and sample.allreduce_s is not None
    assert sample.compute_s + sample.allreduce_s == pytest.approx(1 / sample.speed)

    # job-a came first and four nodes are free, but nobody planned it: it waits.
    knobs = await answer(sim, "job-a", "a-knobs", training={"local_batch_size": 100})
    assert knobs.status is ScaleStatus.PARTIAL
    assert knobs.reason == f"waiting for {AWAITING_SCHEDULER}"
    assert knobs.observed["worker"] == {"pending": 1, "running": 0, "succeeded": 0, "failed": 0}
    assert not sim.tap.of(NodeStarted, "job-a")

    stopped = await answer(sim, "job-b", "b-stop", suspend=True)
    assert stopped.status is ScaleStatus.APPLIED
    assert stopped.reason == f"waiting for {AWAITING_RESUME}"
    assert stopped.observed["worker"]["pending"] == 4
    exits = await sim.tap.until(
        lambda: sim.tap.of(NodeExited, "job-b")[3:] and sim.tap.of(NodeExited, "job-b"),
        "job-b's pods stop",
    )
    assert {e.exit_code for e in exits} == {TERMINATED_EXIT_CODE}

    # job-b's node is free again: job-a goes exactly there.
    moved = await answer(
        sim, "job-a", "a-admit", node_group_resources=workers(4), placement={"node-2": 4}
    )
    assert moved.status is ScaleStatus.APPLIED, moved.reason
    assert moved.observed["worker"]["running"] == 4
    await sim.tap.until(
        lambda: [s for s in sim.tap.of(RuntimeSample, "job-a") if s.world_size == 4] or None,
        "job-a's 4-worker sample",
    )

    wrong = await answer(
        sim, "job-b", "b-nowhere", node_group_resources=workers(4), placement={"node-9": 4}
    )
    assert wrong.status is ScaleStatus.REJECTED
    assert wrong.reason.startswith("placement names 'node-9'")
