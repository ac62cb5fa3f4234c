"""Cluster schedulers end to end on the real broker and Postgres, with the virtual
operator under the brain's admission, in lockstep."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover_events.bus import read_topic
from dlrover_events.settings import Settings
from dlrover_events.topics import SCALE_PLANS, SCALE_RESULTS, topic
from schemas import decode
from schemas.plans import ScalePlan, ScaleResult, ScaleStatus
from streams.ab.arms import PRESETS, Arm
from streams.ab.runner import ABTest, ArmCluster

pytestmark = pytest.mark.integration

#: Jobs that outnumber two nodes' GPUs for a while: the scheduler must share them.
TRACE = """name,time,application,num_replicas,batch_size
ncf-0,10,ncf,1,32768
cifar10-1,20,cifar10,2,256
ncf-2,60,ncf,2,32768
cifar10-3,120,cifar10,4,256
ncf-4,300,ncf,4,32768
ncf-5,310,ncf,1,32768
"""


async def _plans_and_results(
    settings: Settings, env: str
) -> tuple[list[ScalePlan], list[ScaleResult]]:
    plans = [decode(r.value) for r in await read_topic(settings, topic(env, SCALE_PLANS))]
    results = [decode(r.value) for r in await read_topic(settings, topic(env, SCALE_RESULTS))]
    return (
        [p for p in plans if isinstance(p, ScalePlan)],
        [r for r in results if isinstance(r, ScaleResult)],
    )


@pytest.mark.timeout(900)
async def test_schedulers_run_every_job_and_two_runs_give_the_same_jcts(
    settings: Settings, pg_dsn: str, tmp_path: Path
) -> None:
    trace = tmp_path / "small.csv"
    trace.write_text(TRACE)
    goodput = PRESETS["goodput-cluster"]
    test = ABTest(
        settings,
        pg_dsn,
        [Arm("tiresias", PRESETS["tiresias"]), Arm("goodput", goodput)],
        trace=trace,
        cluster=ArmCluster(nodes=2, gpus_per_node=4),
        timeout_s=600,
        poll_s=0.5,
        keep_envs=True,
    )
    results = await test.run()
    for arm in results:
        assert arm.unfinished == 0, arm.name
        assert len(arm.jct) == 6, arm.name
        plans, answers = await _plans_and_results(settings, arm.env)
        # the scheduler admitted every job (the cluster starts none on its own), on named
        # nodes, and the operator applied what it planned
        admitted = {p.job.uuid for p in plans if p.placement}
        assert admitted == set(arm.jct), arm.name
        assert all(sum(p.placement.values()) <= 8 for p in plans)
        # (knobs await the job's own confirmation: partial, with only training parts left)
        applied = {
            r.plan_id
            for r in answers
            if r.status in (ScaleStatus.APPLIED, ScaleStatus.PARTIAL)
            and all(part.part.startswith("training") for part in r.not_applied)
        }
        assert {p.plan_id for p in plans if p.placement} <= applied, arm.name
    # two runs of a lockstep arm give the same per-job JCTs
    again = ABTest(
        settings,
        pg_dsn,
        [Arm("tiresias", PRESETS["tiresias"]), Arm("goodput", goodput)],
        trace=trace,
        cluster=ArmCluster(nodes=2, gpus_per_node=4),
        timeout_s=600,
        poll_s=0.5,
    )
    second = await again.run()
    assert [a.jct for a in second] == [a.jct for a in results]
