"""The env's brain on the example job, on real parts (the local platform's torchrun
agents and torch workers, the broker, Postgres): a wish that differs only by the
workers' memory noise is not published again, and a plan the platform refused is not
asked again while the job is as it was.

Before, under `make run`: worker-resource published a new OptimizePlan at every decision
(its memory target followed the workers' memory to the byte) and asked again for the
resize the local operator refuses ("cannot migrate worker-0: it hosts the job's
rendezvous") at every decision its cooldown let through.
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import datetime
from pathlib import Path

from dlrover_events.bus.topics import BRAIN_PLANS
from schemas.env_settings import BrainSettings, LimitSettings
from schemas.jobs import JobStarted, NodeEvent, RuntimeSample
from schemas.plans import OptimizePlan, OptimizeRequest, ScalePlan, ScaleResult, ScaleStatus
from streams.brain.core.policy import Policy
from streams.brain.runtime.app import Brain
from tests.integration.local.conftest import Local
from tests.integration.local.test_elastic_loop import DEADLINE_S, ROOT, example_job, wait_for
from tests.integration.tap import Tap

#: running-stage samples watched after the first refusal there: a dozen decisions
WATCHED_SAMPLES = 24


def _change(plan: ScalePlan) -> str:
    return plan.model_dump_json(
        include={"node_group_resources", "launch_nodes", "remove_nodes", "migrate_nodes"}
    )


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


async def test_the_brain_neither_republishes_noise_nor_asks_again_what_was_refused(
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
    plans = Tap(local.settings, local.env, (BRAIN_PLANS,))
    await plans.start()
    await brain.start()
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "examples").symlink_to(ROOT / "examples")
    ctx, task = await local.start_operator()
    try:
        job = await local.submit(example_job("elastic-r"), workdir)
        uid = job.uid

        def refused_in_running() -> datetime | None:
            wishes = {p.plan_id: p for p in plans.of(OptimizePlan, uid)}
            sources = {p.plan_id: p.source_plan or "" for p in local.tap.of(ScalePlan, uid)}
            for r in local.tap.of(ScaleResult, uid):
                wish = wishes.get(sources.get(r.plan_id, ""))
                if (
                    r.status == ScaleStatus.REJECTED
                    and wish is not None
                    and wish.stage == "running"
                ):
                    return r.occurred_at
            return None

        first = await wait_for("a refused plan in the running stage", refused_in_running)
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

    # the job changed when its nodes came or went, it started, or a request came
    changes = sorted(
        e.occurred_at
        for e in local.tap.events
        if isinstance(e, NodeEvent | JobStarted | OptimizeRequest) and e.key == uid
    )
    scale_plans = {p.plan_id: p for p in local.tap.of(ScalePlan, uid)}
    refused = [
        (r.occurred_at, _change(scale_plans[r.plan_id]))
        for r in local.tap.of(ScaleResult, uid)
        if r.status == ScaleStatus.REJECTED and r.plan_id in scale_plans
    ]
    for (at, change), (later, again) in itertools.pairwise(refused):
        if change == again:
            assert any(at < c < later for c in changes), (
                f"the refused change was asked again at {later} with nothing changed since {at}"
            )
    wishes = plans.of(OptimizePlan, uid)
    for a, b in itertools.pairwise(wishes):
        assert not _noise_only(a, b), f"a wish published again for noise: {a.reason} / {b.reason}"
    print(
        "plans",
        len(wishes),
        "scale plans",
        len(scale_plans),
        "refused",
        len(refused),
        "samples",
        len(local.tap.of(RuntimeSample, uid)),
    )
