"""A cluster scheduler's plans on the local platform: a placement on named nodes is listed
not applied (processes on this machine go where the OS puts them), a suspend suspends the
job and keeps it, a plan with a count resumes it, and a platform that cannot suspend
rejects a suspend with nothing changed. The reconciler drives a real local cluster,
unstarted: job objects and pods are files, no process runs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from dlrover_events.settings import Settings
from handlers.operator.local.cluster import LocalCluster
from handlers.operator.platform.bodies import ADMITTED, SUSPENDED, JobAdmission, JobView
from handlers.operator.reconcile.reconciler import EnvReconciler
from schemas.jobs import JobMeta
from schemas.plan_parts import NO_PLACEMENT
from schemas.plans import NodeGroupResource, NodeResource, ScalePlan, ScaleStatus

GiB = 2**30


def _job_body() -> dict[str, Any]:
    worker = {
        "replicas": 2,
        "minReplicas": 1,
        "maxReplicas": 6,
        "resources": {"cpu": 1, "memory": "1Gi"},
        "template": {"spec": {"containers": [{"name": "main", "command": ["true"]}]}},
    }
    return {
        "apiVersion": "dlrover-events.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "j"},
        "spec": {"roles": {"worker": worker}},
    }


async def _cluster_with_job(root: Path) -> tuple[LocalCluster, EnvReconciler, JobMeta]:
    cluster = LocalCluster(root)
    made = await cluster.submit_job(_job_body())
    reconciler = EnvReconciler(Settings(), "prod", "postgresql://127.0.0.1:1/unused", cluster)
    meta = JobMeta(uuid=made.uid, name="j", namespace=cluster.namespace)
    return cluster, reconciler, meta


async def test_a_suspend_keeps_the_job_and_a_count_resumes_it(tmp_path: Path) -> None:
    cluster, reconciler, meta = await _cluster_with_job(tmp_path)
    suspend = ScalePlan(env="prod", job=meta, plan_id="suspend-1", suspend=True)

    result = await reconciler._apply(suspend)

    assert result.status is ScaleStatus.APPLIED, result
    assert result.reason.startswith("suspended")
    job = await cluster.get_job("j")
    assert isinstance(job, JobView) and job.suspended
    assert job.document["spec"]["suspend"] is True
    assert job.roles["worker"].replicas == 2  # its size is kept for the resume
    assert job.admission == JobAdmission(
        SUSPENDED, "Preempted", job.admission.message if job.admission else "", "suspend-1"
    )
    assert job.document["status"]["phase"] == "Suspended"
    (condition,) = job.document["status"]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Suspended",
        "True",
        "Preempted",
    )
    assert await cluster.list_pods() == ([], "0")

    resume = ScalePlan(
        env="prod",
        job=meta,
        plan_id="resume-1",
        node_group_resources={"worker": NodeGroupResource(count=2)},
    )
    result = await reconciler._apply(resume)

    assert result.status is ScaleStatus.APPLIED, result
    assert result.reason.startswith("resumed")
    job = await cluster.get_job("j")
    assert isinstance(job, JobView) and not job.suspended
    assert job.admission is not None and (job.admission.state, job.admission.reason) == (
        ADMITTED,
        "Resumed",
    )
    pods, _ = await cluster.list_pods("j")
    assert sorted(p.rank for p in pods) == [0, 1]  # back, as the platform made them
    (condition,) = job.document["status"]["conditions"]
    assert (condition["status"], condition["reason"]) == ("False", "Resumed")


async def test_a_platform_that_cannot_suspend_rejects_a_suspend_and_changes_nothing(
    tmp_path: Path,
) -> None:
    cluster, reconciler, meta = await _cluster_with_job(tmp_path)
    cluster.can_suspend = False  # as a platform without a suspend field would be
    before = copy.deepcopy(await cluster.get_job("j"))
    plan = ScalePlan(env="prod", job=meta, plan_id="suspend-1", suspend=True)

    result = await reconciler._apply(plan)

    assert result.status is ScaleStatus.REJECTED
    assert result.reason.startswith("the local platform cannot suspend a job; nothing was changed")
    assert "\n" not in result.reason
    assert await cluster.get_job("j") == before
    assert await cluster.list_pods() == ([], "0")


async def test_a_placement_is_listed_not_applied_and_the_rest_applies(tmp_path: Path) -> None:
    cluster, reconciler, meta = await _cluster_with_job(tmp_path)
    plan = ScalePlan(
        env="prod",
        job=meta,
        plan_id="place-1",
        node_group_resources={"worker": NodeGroupResource(count=3, node_resource=NodeResource())},
        placement={"node-0": 2, "node-1": 1},
    )

    result = await reconciler._apply(plan)

    assert result.status is ScaleStatus.PARTIAL
    assert [(p.part, p.reason) for p in result.not_applied] == [("placement", NO_PLACEMENT)]
    job = await cluster.get_job("j")
    assert isinstance(job, JobView) and job.roles["worker"].replicas == 3
    assert job.document["spec"]["roles"]["worker"]["replicas"] == 3  # the file says it too
    pods, _ = await cluster.list_pods()
    assert len(pods) == 3
    assert cluster.not_applied(plan) == result.not_applied
