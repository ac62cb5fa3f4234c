"""The local platform drives real processes with the Kubernetes reconciler: a plan is
applied once, nodes start and stop as the job's spec says, node and job events follow."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

from handlers.operator.platform.bodies import PodView
from schemas.jobs import JobSubmitted, NodeExited, NodeStarted
from schemas.plans import NodeGroupResource, ScalePlan, ScaleResult, ScaleStatus
from tests.integration.local.conftest import Local, shims
from tests.integration.tap import DEADLINE_S


def sleeper_job(name: str, replicas: int, **role: Any) -> dict[str, Any]:
    return {
        "apiVersion": "dlrover-events.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "roles": {
                "worker": {
                    "replicas": replicas,
                    "minReplicas": 1,
                    "maxReplicas": 4,
                    "restartPolicy": "Never",
                    "template": {
                        "spec": {
                            "terminationGracePeriodSeconds": 5,
                            "containers": [
                                {
                                    "name": "main",
                                    "command": [
                                        sys.executable,
                                        "-c",
                                        "import time; time.sleep(600)",
                                    ],
                                }
                            ],
                        }
                    },
                    **role,
                }
            }
        },
    }


async def until(what: str, check: Any) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while loop.time() < deadline:
        got = await check()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {what} within {DEADLINE_S:.0f}s")


def node_is(n: int) -> Callable[[NodeStarted], bool]:
    return lambda e: e.node.id == n


def running(pods: list[PodView]) -> dict[int, PodView]:
    return {p.rank: p for p in pods if p.running and not p.deleting}


async def test_a_plan_resizes_a_local_job_once_and_its_nodes_are_processes(local: Local) -> None:
    ctx, task = await local.start_operator()
    try:
        job = await local.submit(sleeper_job("sleepy", 2))
        uid = job.uid
        await local.tap.first(JobSubmitted, uid, lambda e: True, "job.submitted")
        pods = await until("2 running nodes", lambda: _running_count(local, "sleepy", 2))
        assert sorted(pods) == [0, 1]
        for n in (0, 1):
            await local.tap.first(NodeStarted, uid, node_is(n), "node.started")

        meta = local.tap.of(JobSubmitted, uid)[0].job
        grow = ScalePlan(
            env=local.env,
            job=meta,
            plan_id="grow-1",
            node_group_resources={"worker": NodeGroupResource(count=3)},
        )
        await local.producer.publish(grow)
        result = await local.tap.first(ScaleResult, uid, lambda e: e.plan_id == "grow-1", "result")
        assert result.status == ScaleStatus.APPLIED, result
        assert sorted(await until("3 nodes", lambda: _running_count(local, "sleepy", 3))) == [
            0,
            1,
            2,
        ]
        # The same plan delivered again changes nothing.
        await local.producer.publish(grow)
        await local.tap.until(
            lambda: len([r for r in local.tap.of(ScaleResult, uid) if r.plan_id == "grow-1"]) >= 2,
            "a second answer",
        )
        assert len(running(await local.pods("sleepy"))) == 3

        shrink = grow.model_copy(
            update={
                "plan_id": "shrink-1",
                "node_group_resources": {"worker": NodeGroupResource(count=1)},
            }
        )
        await local.producer.publish(shrink)
        result = await local.tap.first(ScaleResult, uid, lambda e: e.plan_id == "shrink-1", "r")
        assert result.status == ScaleStatus.APPLIED, result
        left = await until("1 node", lambda: _only(local, "sleepy", 1))
        assert sorted(left) == [0], "the scale-down removes the highest ranks"
        assert not local.tap.of(NodeExited, uid), "a removed node is no node that exited"
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, DEADLINE_S)
    assert not shims(local.root), "a clean stop ends the nodes' processes"


async def _running_count(local: Local, job: str, n: int) -> dict[int, Any] | None:
    found = running(await local.pods(job))
    return found if len(found) == n else None


async def _only(local: Local, job: str, n: int) -> dict[int, Any] | None:
    pods = await local.pods(job)
    found = running(pods)
    return found if len(found) == n and len(pods) == n else None
