"""The env's brain on the example job, on real parts (the local platform's torchrun
agents and torch workers, the broker, Postgres): the brain plans only what the platform
can apply, and a wish that differs only by the workers' memory noise is not published
again.

Before, under `make run`: worker-resource's resize migrated every worker, worker-0 too,
and the local operator rejected it whole ("cannot migrate worker-0: it hosts the job's
rendezvous"), two of the first three ScalePlans; and worker-resource published a new
OptimizePlan at every decision (its memory target followed the workers' memory to the
byte). Now the platform's capabilities come with its capacity report (its hosts not
counted here), the job's submission names its rendezvous host, and the resize migrates
the other workers only.
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import datetime
from pathlib import Path

from dlrover_events.bus.topics import BRAIN_PLANS, CLUSTER_CAPACITY
from schemas.cluster import CapacityReported
from schemas.env_settings import BrainSettings, LimitSettings
from schemas.jobs import JobSubmitted, RuntimeSample
from schemas.plans import OptimizePlan, ScalePlan, ScaleResult, ScaleStatus
from streams.brain.core.policy import Policy
from streams.brain.runtime.app import Brain
from tests.integration.local.conftest import Local
from tests.integration.local.test_elastic_loop import DEADLINE_S, ROOT, example_job, wait_for
from tests.integration.tap import Tap

#: samples watched after the resize was answered: a dozen decisions
WATCHED_SAMPLES = 24


def _resizes(plan: ScalePlan) -> bool:
    """Whether the plan is a resize of the workers' resources: worker-resource's migrates
    the workers it can (every plan's group repeats the role's resources, so a count alone
    says nothing of a resize)."""
    return bool(plan.migrate_nodes)


def _noise_only(a: OptimizePlan, b: OptimizePlan) -> bool:
    """Whether two wishes differ in nothing but memories less than 1 % apart (the
    example's workers' memory grows by a few KiB a second)."""
    ga, gb = a.resource.node_group_resources, b.resource.node_group_resources
    if a.optimizer != b.optimizer or ga.keys() != gb.keys() or a.resource == b.resource:
        return False
    for role in ga:
        x, y = ga[role], gb[role]
        if (x.count, x.node_resource.cpu) != (y.count, y.node_resource.cpu):
            return False
        mx, my = x.node_resource.memory, y.node_resource.memory
        if abs(mx - my) >= 0.01 * max(mx, my):
            return False
    return a.resource.node_resources == b.resource.node_resources


async def test_the_brain_plans_only_what_the_platform_applies_and_republishes_no_noise(
    local: Local, tmp_path: Path
) -> None:
    # the env's default route (goodput, falling back to worker-resource), deciding every
    # 2 samples and no running-stage cooldown: every decision may publish, and ask
    settings = BrainSettings(
        sample_every=2, running_every=2, limits=LimitSettings(running_cooldown_s=0)
    )
    brain = Brain(
        local.settings, local.env, local.pg_dsn, policy=Policy(settings), checkpoint_every_s=1
    )
    plans = Tap(local.settings, local.env, (BRAIN_PLANS, CLUSTER_CAPACITY))
    await plans.start()
    await brain.start()
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "examples").symlink_to(ROOT / "examples")
    ctx, task = await local.start_operator()
    try:
        job = await local.submit(example_job("elastic-r"), workdir)
        uid = job.uid

        def resized() -> datetime | None:
            """When a plan that changes the workers' resources was answered."""
            resizing = {p.plan_id for p in local.tap.of(ScalePlan, uid) if _resizes(p)}
            for r in local.tap.of(ScaleResult, uid):
                if r.plan_id in resizing:
                    return r.occurred_at
            return None

        first = await wait_for("a resize of the workers answered", resized)
        await wait_for(
            f"{WATCHED_SAMPLES} samples after it",
            lambda: (
                len([s for s in local.tap.of(RuntimeSample, uid) if s.occurred_at > first])
                >= WATCHED_SAMPLES
            ),
        )
        await asyncio.sleep(1)  # (the decisions of the last samples are published)
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, DEADLINE_S)
        await brain.stop()
        await plans.stop()

    # what the platform can apply reached the bus, and the job's rendezvous host with it
    (report, *_) = plans.of(CapacityReported)
    assert not report.hosts_counted  # (no --slots: only what it can apply)
    assert report.capabilities is not None
    assert not report.capabilities.replaces_rendezvous_host
    (submission,) = local.tap.of(JobSubmitted, uid)
    assert submission.roles["worker"].rendezvous_host == 0

    scale_plans = {p.plan_id: p for p in local.tap.of(ScalePlan, uid)}
    results = local.tap.of(ScaleResult, uid)
    refused = [f"{r.plan_id}: {r.reason}" for r in results if r.status == ScaleStatus.REJECTED]
    assert refused == [], f"plans the platform rejected: {refused}"
    resizes = [p for p in scale_plans.values() if _resizes(p)]
    assert resizes, "no resize of the workers was planned"
    for p in resizes:
        assert all(m.node.id != 0 for m in p.migrate_nodes), "worker-0 planned to migrate"
    applied = {r.plan_id for r in results if r.status == ScaleStatus.APPLIED}
    assert {p.plan_id for p in resizes} <= applied
    wishes = plans.of(OptimizePlan, uid)
    for a, b in itertools.pairwise(wishes):
        assert not _noise_only(a, b), f"a wish published again for noise: {a.reason} / {b.reason}"
    print(
        "plans",
        len(wishes),
        "scale plans",
        len(scale_plans),
        "applied",
        len(applied),
        "rejected",
        len(refused),
        "samples",
        len(local.tap.of(RuntimeSample, uid)),
    )
