"""Cluster schedulers end to end on the real broker and Postgres, with the virtual
operator under the brain's admission, in lockstep."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover_events.settings import Settings
from schemas.plans import ScaleStatus
from streams.ab.arms import PRESETS, Arm
from streams.ab.runner import ABTest, ArmCluster
from tests.integration.ab.scheduled import plans_and_results

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


@pytest.mark.timeout(900)
async def test_schedulers_run_every_job_and_two_runs_give_the_same_jcts(
    settings: Settings, pg_dsn: str, tmp_path: Path
) -> None:
    trace = tmp_path / "small.csv"
    trace.write_text(TRACE)

    def ab_test(*, keep_envs: bool) -> ABTest:
        arms = [Arm("tiresias", PRESETS["tiresias"]), Arm("goodput", PRESETS["goodput-cluster"])]
        return ABTest(
            settings,
            pg_dsn,
            arms,
            trace=trace,
            cluster=ArmCluster(nodes=2, gpus_per_node=4),
            timeout_s=600,
            poll_s=0.5,
            keep_envs=keep_envs,
        )

    results = await ab_test(keep_envs=True).run()
    for arm in results:
        assert arm.unfinished == 0, arm.name
        assert len(arm.jct) == 6, arm.name
        plans, answers = await plans_and_results(settings, arm.env)
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
    second = await ab_test(keep_envs=False).run()
    assert [a.jct for a in second] == [a.jct for a in results]
