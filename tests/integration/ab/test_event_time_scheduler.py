"""Cluster schedulers on event time, end to end on the real broker and Postgres: the
virtual operator under the brain's admission, NOT in lockstep (as a real env runs them).

Out of lockstep the A/B runner feeds each submission once the arm's services are ready,
when the arm's simulated clock reaches it, as a real env gets them: the brain (its clock
the events' time) then plans a job when the simulated cluster is at its arrival, not long
before. (Fed all at once, the brain planned every job at the start, and the simulated
cluster had to keep plans for jobs it had not reached yet.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import JOB_EVENTS, topic
from dlrover_events.settings import Settings
from schemas import decode
from schemas.jobs import JobCompleted
from schemas.plans import ScaleStatus
from streams.ab.arms import PRESETS, Arm
from streams.ab.runner import ABTest, ArmCluster
from tests.integration.ab.scheduled import plans_and_results

pytestmark = pytest.mark.integration

#: Short jobs (ncf trains for a minute or so), the later ones submitted long after the
#: first (20 minutes: 6 s of wall time at 200x).
TRACE = """name,time,application,num_replicas,batch_size
ncf-0,0,ncf,1,32768
ncf-1,30,ncf,2,32768
ncf-2,1200,ncf,2,32768
ncf-3,2400,ncf,1,32768
"""

NODES = {"node-0", "node-1"}


@pytest.mark.timeout(300)
async def test_schedulers_on_event_time_run_every_job_on_named_nodes(
    settings: Settings, pg_dsn: str, tmp_path: Path
) -> None:
    trace = tmp_path / "spread.csv"
    trace.write_text(TRACE)
    test = ABTest(
        settings,
        pg_dsn,
        [Arm("tiresias", PRESETS["tiresias"]), Arm("goodput", PRESETS["goodput-cluster"])],
        trace=trace,
        cluster=ArmCluster(nodes=2, gpus_per_node=4, speed=200.0, lockstep=False),
        timeout_s=180,
        poll_s=0.5,
        keep_envs=True,
    )
    for arm in test.arms:
        operator = test.env_settings(arm)["operator"]
        assert (operator["lockstep"], operator["admission"]) == (False, "brain")
    results = await test.run()
    for arm in results:
        assert arm.unfinished == 0, arm.name
        assert len(arm.jct) == 4, arm.name
        plans, answers = await plans_and_results(settings, arm.env)
        # the scheduler admitted every job (the cluster starts none on its own), on the
        # env's named nodes
        placed = [p for p in plans if p.placement]
        assert {p.job.uuid for p in placed} == set(arm.jct), arm.name
        assert {n for p in placed for n in p.placement} <= NODES, arm.name
        assert all(sum(p.placement.values()) <= 8 for p in placed), arm.name
        # the operator answered every plan; a refusal is only of a plan that came after
        # its job had ended on the simulated clock (the brain had not read it yet)
        answered = {r.plan_id: r for r in answers}
        assert {p.plan_id for p in plans} <= set(answered), arm.name
        refused = [r for r in answers if r.status not in (ScaleStatus.APPLIED, ScaleStatus.PARTIAL)]
        assert all(r.reason == "job is completed" for r in refused), (arm.name, refused)
        assert not [r for r in answers if "unknown" in r.reason], arm.name
        # the feed was paced: the brain read ncf-3's submission (20 minutes after ncf-2's)
        # when the simulated cluster was near it, long after ncf-2 had ended there; fed at
        # once, it planned ncf-3 while the cluster was still at the first jobs
        events = [decode(r.value) for r in await read_topic(settings, topic(arm.env, JOB_EVENTS))]
        ended = {e.job.uuid: e.occurred_at for e in events if isinstance(e, JobCompleted)}
        first = min(
            (answered[p.plan_id] for p in placed if p.job.uuid == "ncf-3"),
            key=lambda r: r.occurred_at,
        )
        assert first.occurred_at > ended["ncf-2"], (arm.name, first, ended)
