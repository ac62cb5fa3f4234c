"""A node that outgrows its memory on the local platform: the operator enforces the pod's
memory limit (a cgroup where the machine allows, else RLIMIT_AS) and says what happened."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from dlrover_events.pods.memory import Enforcement, available
from schemas.jobs import JobSubmitted, NodeFailed, NodeOOM, OOMKind
from tests.integration.local.conftest import Local
from tests.integration.local.test_local_platform import sleeper_job

HOG = "import time; hog = b'x' * (400 << 20); time.sleep(60)"


def hungry_job(name: str) -> dict[str, Any]:
    body = sleeper_job(name, 1)
    worker = body["spec"]["roles"]["worker"]
    worker["resources"] = {"memory": "96Mi"}
    worker["template"]["spec"]["containers"][0]["command"] = [sys.executable, "-c", HOG]
    return body


async def test_a_node_past_its_memory_limit_is_reported(local: Local) -> None:
    how = available()
    ctx, task = await local.start_operator()
    try:
        job = await local.submit(hungry_job("hog"))
        uid = job.uid
        await local.tap.first(JobSubmitted, uid, lambda e: True, "job.submitted")
        if how in (Enforcement.CGROUP_V1, Enforcement.CGROUP_V2):
            # The kernel kills it for the cgroup's limit, and the cgroup counts it.
            oom = await local.tap.first(NodeOOM, uid, lambda e: True, "node.oom")
            assert oom.kind == OOMKind.HOST_MEMORY
            assert oom.exit_code == 137
            assert oom.memory == 96 << 20
        else:
            # RLIMIT_AS: the allocation fails inside the process, which exits with an error.
            failed = await local.tap.first(NodeFailed, uid, lambda e: True, "node.failed")
            assert failed.exit_code == 1
            log = (local.root / "pods" / "hog-worker-0" / "log").read_text()
            assert "MemoryError" in log
        await asyncio.sleep(0)
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, 120)


async def test_rlimit_as_stops_a_node_where_no_cgroup_can_be_made(tmp_path: Any) -> None:
    """The fallback, forced: the allocation fails in the process (a MemoryError), the node
    ends with an error, and its exit record says which limit was in force."""
    from handlers.operator.local.cluster import LocalCluster
    from handlers.operator.platform.bodies import NewPod

    cluster = LocalCluster(tmp_path, runs_pods=True, enforcement=Enforcement.RLIMIT_AS, poll_s=0.1)
    await cluster.start()
    try:
        # The memory is the template's own limit: the node's resources leave it unset.
        container = {
            "name": "main",
            "command": [sys.executable, "-c", HOG],
            "resources": {"limits": {"memory": "256Mi"}},
        }
        job = await cluster.submit_job(
            {
                "apiVersion": "dlrover-events.io/v1alpha1",
                "kind": "TrainingJob",
                "metadata": {"name": "hog"},
                "spec": {
                    "roles": {
                        "worker": {
                            "replicas": 1,
                            "template": {"spec": {"containers": [container]}},
                        }
                    }
                },
            }
        )
        assert await cluster.create_pod(job, NewPod("worker", 0, 0, job.wanted("worker", 0)), "e")
        for _ in range(300):
            pods, _ = await cluster.list_pods()
            if pods and pods[0].finished:
                break
            await asyncio.sleep(0.1)
        (pod,) = pods
        assert pod.phase == "Failed", pod
        assert pod.termination is not None and pod.termination.exit_code == 1
        assert pod.resources.memory == 256 * 2**20
        exit_record = (tmp_path / "pods" / "hog-worker-0" / "exit.json").read_text()
        assert '"memoryLimit": "rlimit-as"' in exit_record
        assert "MemoryError" in (tmp_path / "pods" / "hog-worker-0" / "log").read_text()
    finally:
        await cluster.stop(end_pods=True)
