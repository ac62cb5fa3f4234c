"""The in-place example (examples/elastic/job-inplace.yaml) on the local platform, on real
parts: plans resize it 2 -> 3 -> 1 -> 2 and no surviving worker restarts; scale-ups admit
the warm spare the platform keeps; a worker SIGKILLed mid-training is survived in place.

Waits are bounded by generous deadlines; nothing asserts on how long anything took (the
phases in the events are measured, not asserted).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import psutil
import yaml  # type: ignore[import-untyped,unused-ignore]

from handlers.operator.local.bench import worker_lines
from handlers.operator.local.spares import SPARES
from schemas.jobs import JobSubmitted, RuntimeSample
from schemas.plans import RescaleMode, ScalePlan, ScaleResult, ScaleStatus, TrainingRescaled
from tests.integration.local.conftest import Local
from tests.integration.local.test_elastic_loop import of_plan, scale_cli, wait_for

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "elastic" / "job-inplace.yaml"
CHECKPOINT_EVERY = 10


def in_place_job(name: str, spares: int = 1) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"]["name"] = name
    worker = body["spec"]["roles"]["worker"]
    worker["elastic"]["spares"] = spares
    worker["elastic"]["command"] = [
        "python",
        "examples/elastic/train_elastic.py",
        "--steps=100000",
        "--interval-s=0.5",
        "--step-sleep-s=0.05",
        "--loss-every=5",
        f"--checkpoint=.checkpoints/{name}.pt",
        f"--checkpoint-every={CHECKPOINT_EVERY}",
    ]
    return body


def lines(local: Local, *kinds: str) -> list[dict[str, Any]]:
    """What the workers printed of ``kinds`` (live pods and kept logs), each with its pod."""
    logs = [*local.root.glob("pods/*/log"), *local.root.glob("logs/*.log")]
    return sorted(worker_lines(logs, kinds), key=lambda e: e["time"])


def running_spares(local: Local) -> list[Path]:
    found = []
    for spare in (local.root / SPARES).glob("*"):
        pid = spare / "pid"
        if pid.exists() and not (spare / "exit.json").exists():
            found.append(spare)
    return found


async def workdir_of(tmp_path: Path) -> Path:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "examples").symlink_to(ROOT / "examples")
    return workdir


async def test_an_in_place_job_resizes_2_3_1_2_and_its_survivors_go_on(
    local: Local, tmp_path: Path
) -> None:
    workdir = await workdir_of(tmp_path)
    ctx, task = await local.start_operator()
    try:
        job = await local.submit(in_place_job("inplace-a"), workdir)
        uid = job.uid
        await local.tap.first(JobSubmitted, uid, lambda e: True, "job.submitted")

        def samples_at(n: int) -> list[RuntimeSample]:
            return [s for s in local.tap.of(RuntimeSample, uid) if s.world_size == n]

        await wait_for("samples at world size 2", lambda: samples_at(2))
        await wait_for("a warm spare", lambda: running_spares(local))
        first = [m for m in lines(local, "membership") if m["world_size"] == 2]
        pid_of = {m["node"]: m["pid"] for m in first}
        assert len(pid_of) == 2

        for target in (3, 1, 2):
            # a scale-up takes the spare; the platform starts another for the next one
            await wait_for("a warm spare", lambda: running_spares(local))
            plan_id = scale_cli(local, "inplace-a", target)
            plan = await local.tap.first(ScalePlan, uid, of_plan(plan_id), f"plan {plan_id}")
            result = await local.tap.first(
                ScaleResult, uid, of_plan(plan_id), f"result of {plan_id}"
            )
            assert result.status == ScaleStatus.APPLIED, result
            assert result.rescale_mode is RescaleMode.IN_PLACE
            after = plan.occurred_at
            rescaled = await local.tap.first(
                TrainingRescaled,
                uid,
                lambda e, t=target, a=after: e.world_size == t and e.occurred_at > a,
                f"training.rescaled to {target}",
            )
            assert rescaled.mode is RescaleMode.IN_PLACE
            assert rescaled.steps_lost == 0
            phases = rescaled.phases
            assert None not in (phases.agreement_s, phases.reform_s, phases.first_step_s)
            await wait_for(f"samples at world size {target}", lambda t=target: samples_at(t))

        memberships = lines(local, "membership")
        # node 0 trained in every world in one process; node 1 in 2 and 3 in one, then
        # left (the last scale-up fills rank 1 again, with a newcomer)
        assert {m["pid"] for m in memberships if m["node"] == 0} == {pid_of[0]}
        assert [m["world_size"] for m in memberships if m["pid"] == pid_of[1]] == [2, 3]
        assert [m["world_size"] for m in memberships if m["node"] == 0] == [2, 3, 1, 2]
        # both scale-ups admitted a warm spare instead of starting a process cold
        joined = [m for m in memberships if m["node"] != 0 and m["generation"] > 1]
        newcomers = [m for m in joined if m["pid"] not in pid_of.values()]
        assert len(newcomers) == 2 and all(m["spare"] for m in newcomers), newcomers
        exits = lines(local, "exit")
        assert {e["reason"] for e in exits if e["node"] in (1, 2)} <= {"left"}
        # the step count never went back, and the newcomers trained with the state they
        # were sent (their loss is node 0's at the same step, not a fresh model's ~2.08)
        by_node: dict[str, list[int]] = {}
        for s in local.tap.of(RuntimeSample, uid):
            by_node.setdefault(s.source, []).append(s.global_step)
        for source, steps in by_node.items():
            assert all(b >= a for a, b in itertools.pairwise(steps)), (source, steps)

        # Each rank's loss is of its own batch, so one line can be ~0.5 off another rank's at
        # the same step: the mean of a newcomer's first three lines is compared. The last
        # newcomer may not have printed them yet when its world's samples came (seen in CI).
        def newcomer_losses() -> list[list[dict[str, Any]]] | None:
            printed = lines(local, "loss", "exit")  # the logs read once per look
            losses = [e for e in printed if e["event"] == "loss"]
            gone = {e["pod"] for e in printed if e["event"] == "exit"}
            found = []
            for m in newcomers:
                mine = [e for e in losses if e["pod"] == m["pod"]][:3]
                if len(mine) < 3 and m["pod"] not in gone:
                    return None
                found.append(mine)
            return found

        per_newcomer = await wait_for("three loss lines of each newcomer", newcomer_losses)
        losses = lines(local, "loss")
        for m, mine in zip(newcomers, per_newcomer, strict=True):
            assert mine, m
            theirs = []
            for e in mine:
                at_step = [o["loss"] for o in losses if o["step"] == e["step"] and o is not e]
                assert at_step, e
                theirs.append(at_step[0])
            mean_mine = sum(e["loss"] for e in mine) / len(mine)
            assert abs(sum(theirs) / len(theirs) - mean_mine) < 0.5, (mine, theirs)
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, 240)
    assert not running_spares(local)  # the operator's clean stop ended the spare too
    # every pod's log was kept, worker-1's two pods' both (the name came back at 1 -> 2)
    kept = {m["pid"] for m in worker_lines(list(local.root.glob("logs/*.log")), ("membership",))}
    assert set(pid_of.values()) | {m["pid"] for m in newcomers} <= kept


async def test_a_killed_worker_is_survived_in_place_on_the_platform(
    local: Local, tmp_path: Path
) -> None:
    workdir = await workdir_of(tmp_path)
    ctx, task = await local.start_operator()
    try:
        job = await local.submit(in_place_job("inplace-b", spares=0), workdir)
        uid = job.uid
        await wait_for(
            "samples at world size 2",
            lambda: [s for s in local.tap.of(RuntimeSample, uid) if s.world_size == 2],
        )
        first = {m["node"]: m for m in lines(local, "membership") if m["world_size"] == 2}
        killed_at = time.time()
        psutil.Process(first[1]["pid"]).kill()
        lost = await local.tap.first(
            TrainingRescaled,
            uid,
            lambda e: e.world_size == 1 and e.reason == "a peer was lost",
            "training.rescaled without the killed worker",
        )
        assert lost.mode is RescaleMode.IN_PLACE and lost.world_size_before == 2
        # its agent starts it again and the job takes it back in place
        back = await local.tap.first(
            TrainingRescaled,
            uid,
            lambda e: e.world_size == 2 and e.occurred_at > lost.occurred_at,
            "training.rescaled with the worker back",
        )
        assert back.mode is RescaleMode.IN_PLACE
        after = [m for m in lines(local, "membership") if m["time"] > killed_at]
        assert {m["pid"] for m in after if m["node"] == 0} == {first[0]["pid"]}
        assert [m["restart"] for m in after if m["node"] == 1] == [1]
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, 240)
