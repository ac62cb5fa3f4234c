"""A virtual operator killed with SIGKILL and started again goes on with its simulated
cluster: later plans apply to the jobs it had, the jobs keep their progress and clock, and
no plan is applied twice (the checkpoint and the ledger row are written together)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import pytest

from handlers.operator.virtual.operator import ALREADY_APPLIED
from schemas.jobs import NodeStarted, RuntimeSample
from schemas.plans import NodeGroupResource, ScaleResult, ScaleStatus
from tests.integration.operator.conftest import OPTIONS, Sim
from tests.integration.operator.processes import Service, operator_lock
from tests.integration.operator.test_virtual_operator import plan_row

pytestmark = pytest.mark.integration


def operator(sim: Sim, log: Path) -> Service:
    args = [f"--{k.replace('_', '-')}={v}" for k, v in OPTIONS.items() if k != "nodes"]
    return Service(
        sim.settings,
        sim.pg_dsn,
        ["operator", "--env", sim.env, "--nodes", str(OPTIONS["nodes"]), *args],
        log,
        lock_key=operator_lock(sim.env),
    )


def first_answers(sim: Sim, plan_id: str) -> list[ScaleResult]:
    """Distinct results that say the plan was applied now, not that it had been."""
    seen = {r.event_id: r for r in sim.tap.of(ScaleResult) if r.plan_id == plan_id}
    return [r for r in seen.values() if not r.reason.startswith(ALREADY_APPLIED)]


def distinct_samples(sim: Sim, job: str) -> list[RuntimeSample]:
    seen = {s.event_id: s for s in sim.tap.of(RuntimeSample, job)}
    return sorted(seen.values(), key=lambda s: s.occurred_at)


def back_to_one(sim: Sim, job: str) -> bool:
    """A 1-worker sample after the job's 3-worker ones (its last plan made it 1)."""
    samples = distinct_samples(sim, job)
    three = [s.occurred_at for s in samples if len(s.nodes) == 3]
    return bool(three) and any(len(s.nodes) == 1 and s.occurred_at > max(three) for s in samples)


async def scale(sim: Sim, job: str, plan_id: str, workers: int) -> None:
    groups = {"worker": NodeGroupResource(count=workers)}
    await sim.producer.publish(sim.plan(job, plan_id, node_group_resources=groups))


async def answered(sim: Sim, plan_id: str) -> ScaleResult:
    (result,) = await sim.tap.until(lambda: first_answers(sim, plan_id) or None, plan_id)
    return result


async def test_a_killed_operator_goes_on_with_its_jobs_and_applies_no_plan_twice(
    sim: Sim, tmp_path: Path
) -> None:
    proc = operator(sim, tmp_path / "operator.log")
    await proc.start()
    try:
        await sim.submit("job-a")
        await sim.submit("job-b")
        for job in ("job-a", "job-b"):
            await sim.tap.until(lambda j=job: distinct_samples(sim, j) or None, f"{job} sample")
        await scale(sim, "job-a", "a-2", 2)
        assert (await answered(sim, "a-2")).status is ScaleStatus.APPLIED

        await proc.kill()
        await proc.start()
        # After the restart: the jobs exist (no "unknown job"), a repeat is a repeat.
        await scale(sim, "job-a", "a-3", 3)
        await scale(sim, "job-b", "b-2", 2)
        await scale(sim, "job-a", "a-2", 2)  # delivered again, with a new event id
        for plan_id in ("a-3", "b-2"):
            result = await answered(sim, plan_id)
            assert result.status is ScaleStatus.APPLIED, result.reason
        repeat = await sim.tap.until(
            lambda: [r for r in sim.tap.of(ScaleResult) if r.plan_id == "a-2"][1:] or None,
            "the answer to a-2 delivered again",
        )
        assert repeat[0].reason.startswith(ALREADY_APPLIED)

        # Killed at a random point around a plan, then again right after its restart.
        rng = random.Random(15)
        for n, (job, workers) in enumerate([("job-b", 3), ("job-a", 1), ("job-b", 1)]):
            await scale(sim, job, f"late-{n}", workers)
            await asyncio.sleep(rng.uniform(0.0, 1.5))
            await proc.kill()
            await proc.start()
        for n in range(3):
            result = await answered(sim, f"late-{n}")
            assert result.status is ScaleStatus.APPLIED, result.reason
        # The jobs train on at their new sizes, on the same clock.
        for job in ("job-a", "job-b"):
            await sim.tap.until(lambda j=job: back_to_one(sim, j), f"{job} on 1 worker again")
        proc.alive()
    finally:
        await proc.stop()

    assert proc.kills == 4
    for plan_id in ("a-2", "a-3", "b-2", "late-0", "late-1", "late-2"):
        assert len(first_answers(sim, plan_id)) == 1, f"{plan_id} applied more than once"
        row = await plan_row(sim, plan_id)
        assert row is not None
        assert row["status"] == "applied"
    assert not [r for r in sim.tap.of(ScaleResult) if r.status is ScaleStatus.REJECTED]
    for job in ("job-a", "job-b"):
        samples = distinct_samples(sim, job)
        times = [s.occurred_at for s in samples]
        assert len(set(times)) == len(times), "one sample per simulated instant"
        steps = [s.global_step for s in samples]
        assert steps == sorted(steps), f"{job} kept its progress across the restarts"
        # every node start is said once: no job was started again from scratch
        started = {e.event_id: e for e in sim.tap.of(NodeStarted, job)}.values()
        starts = Counter(e.node.id for e in started)
        assert starts[0] == 1, f"{job}'s first worker started {starts[0]} times"
