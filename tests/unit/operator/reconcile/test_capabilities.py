"""What a platform can apply is its own declaration (``PlatformCapabilities``): its rules
follow it, its operator publishes it with the capacity, and a plan the brain makes under
it is one the platform applies.

Before: the local platform passed ``gpu_types=False`` back into the rules, nothing told
the brain that an elastic role's rendezvous host cannot be replaced, and the README's
example job had two of its first three ScalePlans rejected ("cannot migrate worker-0:
it hosts the job's rendezvous").
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from handlers.operator.document.trainingjob import parse_job
from handlers.operator.kube.pytorchjob import PYTORCH_JOB
from handlers.operator.kube.trainingjob import TRAINING_JOB, TrainingJobAdapter
from handlers.operator.local.cluster import LocalCluster
from handlers.operator.platform.bodies import (
    Host,
    JobView,
    PlatformCapabilities,
    PodView,
    Resources,
)
from handlers.operator.platform.errors import PlanRejected
from handlers.operator.platform.fencing import FencedPlatform
from handlers.operator.reconcile.capacity import CapacityReporter, declared, report
from handlers.operator.reconcile.events import node_events, submitted
from handlers.operator.reconcile.planning import plan_change
from schemas.cluster import CapacityReported
from schemas.jobs import NodeRef
from schemas.plans import (
    MigrateNode,
    NodeGroupResource,
    NodeResource,
    OptimizePlan,
    ScalePlan,
)
from streams.brain.core.folds import fold_all
from streams.brain.core.optimizers.api import group_plan
from streams.brain.core.planner import plan_scale
from streams.brain.core.state import Stage

EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "elastic" / "job.yaml"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
GiB = 2**30
UID = "uid-1"


def pod(rank: int) -> PodView:
    """A running worker of the example job, at the resources it asks for."""
    return PodView(
        name=f"elastic-mnist-worker-{rank}",
        uid=f"pod-{rank}",
        job="elastic-mnist",
        job_uid=UID,
        role="worker",
        rank=rank,
        index=rank,
        phase="Running",
        deleting=False,
        resources=Resources(cpu_milli=1000, memory=4 * GiB),
    )


def plan(**fields: Any) -> ScalePlan:
    return ScalePlan(env="prod", job={"uuid": UID, "name": "elastic-mnist"}, plan_id="p1", **fields)


def example(replicas: int = 2) -> JobView:
    """The README's example job, as a platform reads it."""
    body: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] |= {"namespace": "ns", "uid": UID, "resourceVersion": "7", "generation": 1}
    body["spec"]["roles"]["worker"]["replicas"] = replicas
    return parse_job(body)


def test_each_platform_declares_what_it_can_apply(tmp_path: Path) -> None:
    local = LocalCluster(tmp_path)
    assert local.capabilities == PlatformCapabilities(
        gpu_types=False,
        spares=True,
        suspend=True,
        migrates_nodes=True,
        replaces_rendezvous_host=False,
    )
    local.can_suspend = False  # (as a platform without a suspend would be)
    assert local.capabilities.suspend is False
    fenced = FencedPlatform(local, lambda: True)
    assert fenced.capabilities == local.capabilities
    # a TrainingJob on Kubernetes selects GPU types where its nodes name theirs
    assert TRAINING_JOB.capabilities.gpu_types is False
    labelled = TrainingJobAdapter(gpu_type_label="nvidia.com/gpu.product")
    assert labelled.capabilities.gpu_types is True
    assert labelled.capabilities.replaces_rendezvous_host is False
    # a PyTorchJob's pods are the training-operator's: no node is migrated
    assert PYTORCH_JOB.capabilities.migrates_nodes is False
    assert PYTORCH_JOB.capabilities.spares is False


def test_the_rules_follow_the_declaration() -> None:
    job, pods = example(), [pod(0), pod(1)]
    move_host = plan(
        migrate_nodes=[
            MigrateNode(node=NodeRef(type="worker", id=0), resource=NodeResource(memory=8 * GiB))
        ]
    )
    with pytest.raises(PlanRejected, match="cannot migrate worker-0: it hosts the job's"):
        plan_change(job, pods, move_host, PlatformCapabilities(replaces_rendezvous_host=False))
    moved = plan_change(job, pods, move_host, PlatformCapabilities(replaces_rendezvous_host=True))
    assert moved.change.node_resources["worker"][0].memory == 8 * GiB
    a100 = NodeGroupResource(node_resource=NodeResource(gpu_type="a100"))
    typed = plan(node_group_resources={"worker": a100})
    assert plan_change(job, pods, typed).change.resources == {}  # (nothing else changes)
    chosen = plan_change(job, pods, typed, PlatformCapabilities(gpu_types=True))
    assert chosen.change.resources["worker"].gpu_type == "a100"


def test_the_brains_plan_under_the_local_declaration_is_one_the_local_platform_applies(
    tmp_path: Path,
) -> None:
    """The operator's own events of the example job, folded by the brain; the resize
    worker-resource asked for in the first minutes, planned with and without the local
    platform's word; each plan put to the local platform's rules."""
    job, pods = example(), [pod(0), pod(1)]
    events = [submitted("prod", job, T0)]
    events += [e for p in pods for e in node_events("prod", events[0].job, p)]
    brain_job = fold_all(None, events)
    assert brain_job is not None
    assert brain_job.roles["worker"].rendezvous_host == 0
    brain_job = brain_job.model_copy(update={"stage": Stage.WORKER_INITIAL.value})
    wish = OptimizePlan(
        env="prod",
        job=brain_job.job,
        plan_id="o-1",
        stage="worker-initial",
        optimizer="worker-resource",
        reason="worker cpu 2 from use, memory 512 MiB from peak",
        caused_by="e-1",
        resource=group_plan("worker", cpu=2, memory=512 * 2**20),
    )
    local = LocalCluster(tmp_path)
    told = plan_scale(
        brain_job, wish, T0, optimizers=("worker-resource",), platform=declared(local.capabilities)
    ).scale_plan
    assert told is not None
    assert [m.node.id for m in told.migrate_nodes] == [1]
    applied = local.plan_change(job, pods, told)
    assert "migrate worker-1" in applied.summary and "worker-0" not in applied.summary
    untold = plan_scale(brain_job, wish, T0, optimizers=("worker-resource",)).scale_plan
    assert untold is not None
    with pytest.raises(PlanRejected, match="cannot migrate worker-0"):
        local.plan_change(job, pods, untold)


def test_a_report_carries_the_declaration_and_says_whether_hosts_are_counted() -> None:
    caps = PlatformCapabilities(suspend=True, spares=True)
    counted = report("prod", "local", {"m": Host("m", 4)}, caps)
    assert counted.hosts_counted and counted.gpus == 4
    assert counted.capabilities is not None
    assert counted.capabilities.model_dump() == {
        "gpu_types": False,
        "spares": True,
        "suspend": True,
        "migrates_nodes": True,
        "replaces_rendezvous_host": False,
    }
    uncounted = report("prod", "local", {}, caps, counted=False)
    assert not uncounted.hosts_counted and uncounted.hosts == []


async def test_a_platform_that_counts_no_hosts_still_says_what_it_can_apply() -> None:
    said: list[CapacityReported] = []

    async def publish(r: CapacityReported) -> None:
        said.append(r)

    caps = PlatformCapabilities(suspend=True)
    reporter = CapacityReporter("prod", "local", None, publish, capabilities=caps)
    task = asyncio.create_task(reporter.run())
    for _ in range(100):
        if said:
            break
        await asyncio.sleep(0.01)
    assert not task.done()  # (it lives as long as the operator: its end would end it)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (one,) = said
    assert one.platform == "local" and not one.hosts_counted
    assert one.capabilities == declared(caps)
