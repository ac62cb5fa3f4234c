"""The closed loop on real parts: the example elastic job (examples/elastic) runs on the
local platform as torchrun agents and torch workers on this machine, and plans change it.

Waits are bounded by generous deadlines; nothing asserts on how long anything took (the
note's timings come from the same events, measured, not asserted).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped,unused-ignore]

from handlers.operator.local.bench import memberships as worker_lines
from schemas.env_settings import BrainSettings, LimitSettings
from schemas.jobs import JobSubmitted, RuntimeSample
from schemas.plans import ScalePlan, ScaleResult, ScaleStatus
from streams.brain.core.policy import Policy
from streams.brain.runtime.app import Brain
from tests.conftest import cli_environ
from tests.integration.local.conftest import Local

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "elastic" / "job.yaml"
CHECKPOINT_EVERY = 10
DEADLINE_S = 240.0
PLAN_PARTS = {"node_group_resources", "launch_nodes", "remove_nodes", "migrate_nodes", "training"}


def example_job(name: str, replicas: int = 2) -> dict[str, Any]:
    """The example's spec, with a short sample interval and a checkpoint file."""
    body: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["name"] = name
    worker = body["spec"]["roles"]["worker"]
    worker["replicas"] = replicas
    worker["elastic"]["command"] = [
        "python",
        "examples/elastic/train_elastic.py",
        "--steps=100000",
        "--interval-s=0.5",
        "--step-sleep-s=0.05",
        f"--checkpoint=.checkpoints/{name}.pt",
        f"--checkpoint-every={CHECKPOINT_EVERY}",
    ]
    return body


def of_plan(plan_id: str) -> Callable[[ScalePlan | ScaleResult], bool]:
    return lambda e: e.plan_id == plan_id


def to_workers(count: int) -> Callable[[ScalePlan], bool]:
    def matches(plan: ScalePlan) -> bool:
        group = plan.node_group_resources.get("worker")
        return group is not None and group.count == count

    return matches


def memberships(local: Local) -> list[dict[str, Any]]:
    """The `membership` lines every worker printed: one per rendezvous it trained in."""
    return [m for m in worker_lines(local.root) if m["event"] == "membership"]


async def wait_for(what: str, check: Any, deadline_s: float = DEADLINE_S) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    while loop.time() < deadline:
        got = check()
        if got:
            return got
        await asyncio.sleep(0.2)
    raise AssertionError(f"no {what} within {deadline_s:.0f}s")


def scale_cli(local: Local, job: str, replicas: int) -> str:
    """`dlrover-events job scale` as a user runs it; returns the plan id it published."""
    env = {
        **cli_environ(local.settings, local.pg_dsn),
        "DLROVER_EVENTS_DATA_DIR": str(local.settings.data_dir),
    }
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "dlrover-events"),
            "job",
            "scale",
            job,
            "--replicas",
            str(replicas),
            "--platform",
            "local",
            "--env",
            local.env,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()[1]


async def test_job_scale_resizes_a_running_elastic_job_2_3_1(local: Local, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "examples").symlink_to(ROOT / "examples")
    ctx, task = await local.start_operator()
    try:
        job = await local.submit(example_job("elastic-a"), workdir)
        uid = job.uid
        await local.tap.first(JobSubmitted, uid, lambda e: True, "job.submitted")

        def samples_at(n: int) -> list[RuntimeSample]:
            return [s for s in local.tap.of(RuntimeSample, uid) if s.world_size == n]

        await wait_for("samples at world size 2", lambda: samples_at(2))
        timings = {}
        for target in (3, 1):
            plan_id = scale_cli(local, "elastic-a", target)
            plan = await local.tap.first(ScalePlan, uid, of_plan(plan_id), f"plan {plan_id}")
            result = await local.tap.first(
                ScaleResult, uid, of_plan(plan_id), f"result of {plan_id}"
            )
            assert result.status == ScaleStatus.APPLIED, result
            first = await wait_for(
                f"a membership at world size {target}",
                lambda t=target, after=plan.occurred_at.timestamp(): [
                    m for m in memberships(local) if m["world_size"] == t and m["time"] > after
                ],
            )
            timings[target] = min(m["time"] for m in first) - plan.occurred_at.timestamp()
            await wait_for(f"samples at world size {target}", lambda t=target: samples_at(t))

        # Each plan was applied once: one applied result each, whatever else was said.
        results = local.tap.of(ScaleResult, uid)
        assert len({r.plan_id for r in results}) == 2
        # The global step never went back by more than the checkpoint interval.
        steps = [s.global_step for s in local.tap.of(RuntimeSample, uid)]
        high = 0
        for step in steps:
            assert step >= high - CHECKPOINT_EVERY, (step, high)
            high = max(high, step)
        print(json.dumps({"plan_to_membership_s": timings, "memberships": memberships(local)}))
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, DEADLINE_S)


async def test_the_brains_goodput_plans_resize_the_running_job_2_3_1(
    local: Local, tmp_path: Path
) -> None:
    """No plan by hand: the goodput optimizer explores one worker more (2 -> 3), then fits
    the step times it saw at 2 and 3 and, asked for 99.9 % per-worker efficiency, shrinks
    to 1. The job pays 0.1 s of synchronisation per step times log2(workers) (a larger
    model's all-reduce): without it the step times at 2 and 3 differed by a few ms of
    all-reduce on two shared cores, which the load of a CI run beside it could turn
    around; the fit then saw no cost in scale and planned nothing more (one CI run)."""
    settings = BrainSettings(
        sample_every=2,
        running_every=2,
        limits=LimitSettings(running_cooldown_s=5),
        job_config={
            "optimizer": "goodput",
            "optimizer_params": {
                "goodput": {"max_workers": 3, "min_samples": 4, "min_efficiency": 0.999}
            },
        },
    )
    brain = Brain(
        local.settings, local.env, local.pg_dsn, policy=Policy(settings), checkpoint_every_s=1
    )
    await brain.start()
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "examples").symlink_to(ROOT / "examples")
    ctx, task = await local.start_operator()
    try:
        body = example_job("elastic-b")
        body["spec"]["roles"]["worker"]["elastic"]["command"].append("--sync-cost-s=0.1")
        job = await local.submit(body, workdir)
        uid = job.uid
        for target in (3, 1):
            plan = await local.tap.first(
                ScalePlan,
                uid,
                to_workers(target),
                f"the brain's plan to {target} workers",
            )
            result = await local.tap.first(
                ScaleResult, uid, of_plan(plan.plan_id), f"result of {plan.plan_id}"
            )
            assert result.status == ScaleStatus.APPLIED, result
            await wait_for(
                f"a membership at world size {target}",
                lambda t=target, after=plan.occurred_at.timestamp(): [
                    m for m in memberships(local) if m["world_size"] == t and m["time"] > after
                ],
            )
    finally:
        for p in local.tap.of(ScalePlan, uid):
            print(
                "plan",
                p.occurred_at,
                p.plan_id,
                p.model_dump_json(
                    include={
                        "node_group_resources",
                        "launch_nodes",
                        "remove_nodes",
                        "migrate_nodes",
                        "training",
                    }
                ),
            )
        for r in local.tap.of(ScaleResult, uid):
            print("result", r.occurred_at, r.plan_id, r.status, r.reason)
        for m in memberships(local):
            print("membership", m)
        ctx.stop.set()
        await asyncio.wait_for(task, DEADLINE_S)
        await brain.stop()
