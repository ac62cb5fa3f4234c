"""Kubeflow PyTorchJobs on a real kube-apiserver v1.20.2, broker and Postgres.

There is no training-operator: the test plays it, as FakeKubelet plays the kubelet. It
creates the pods the training-operator would (its labels, a controller reference to the
job) and writes the job's status conditions through the status subresource. The
operator under test must only patch the job's Worker replicas, never create, delete or
write the status of anything.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from dlrover_events.bus.producer import Producer
from dlrover_events.settings import Settings
from handlers.operator.document.trainingjob import ANN_PLANS
from handlers.operator.kube.client import KubeApi
from handlers.operator.kube.pytorchjob import (
    GROUP,
    KIND,
    LABEL_JOB_NAME,
    LABEL_OPERATOR_NAME,
    LABEL_REPLICA_INDEX,
    LABEL_REPLICA_TYPE,
    OPERATOR_NAME,
    PLURAL,
    PYTORCH_JOB,
    VERSION,
)
from handlers.operator.platform.bodies import JobView
from handlers.operator.reconcile.events import job_meta
from handlers.operator.reconcile.reconciler import ALREADY_APPLIED
from schemas.jobs import JobCompleted, JobStarted, JobSubmitted, NodeFailed, NodeStarted
from schemas.plans import NodeGroupResource, ScalePlan, ScaleResult, ScaleStatus
from tests.integration.tap import Tap

from .kube import (
    DEPLOY,
    FakeKubelet,
    load_yaml_documents,
    merge_patch,
    now,
    service_account_client,
    unique_name,
)
from .test_kube_testenv import apply_rbac, eventually_allowed, expect_forbidden, expect_status
from .test_reconciler_support import Cluster, until

pytestmark = pytest.mark.integration


@pytest.fixture
async def tap(settings: Settings, env: str) -> AsyncIterator[Tap]:
    t = Tap(settings, env)
    await t.start()
    try:
        yield t
    finally:
        await t.stop()


@pytest.fixture
async def producer(settings: Settings) -> AsyncIterator[Producer]:
    async with Producer(settings) as p:
        yield p


@pytest.fixture
async def pytorch(cluster: Cluster, pytorchjob_crd: str) -> Cluster:
    """The test's cluster, its reconcilers driving PyTorchJobs."""
    cluster.kube = KubeApi(cluster.api, PYTORCH_JOB, cluster.namespace)
    return cluster


def pytorchjob(name: str, *, replicas: int = 2, low: int = 1, high: int = 4) -> dict[str, Any]:
    """An elastic PyTorchJob as its users write one (the training-operator's echo example,
    with bounds)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "labels": {"dlrover-events.io/app": "resnet"}},
        "spec": {
            "elasticPolicy": {
                "rdzvBackend": "c10d",
                "minReplicas": low,
                "maxReplicas": high,
                "maxRestarts": 100,
            },
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": replicas,
                    "restartPolicy": "Never",
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "pytorch",
                                    "image": "registry.example.com/echo:1.0",
                                    "command": ["python", "-m", "torch.distributed.run", "echo.py"],
                                    "resources": {"limits": {"cpu": "2", "memory": "4Gi"}},
                                }
                            ]
                        }
                    },
                }
            },
        },
    }


def operator_pod(job: dict[str, Any], index: int, role: str = "worker") -> dict[str, Any]:
    """The pod the training-operator makes for replica ``index`` of ``job``."""
    name = job["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-{role}-{index}",
            "labels": {
                LABEL_OPERATOR_NAME: OPERATOR_NAME,
                LABEL_JOB_NAME: name,
                LABEL_REPLICA_TYPE: role,
                LABEL_REPLICA_INDEX: str(index),
            },
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": KIND,
                    "name": name,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "pytorch",
                    "image": "registry.example.com/echo:1.0",
                    "resources": {"limits": {"cpu": "2", "memory": "4Gi"}},
                }
            ],
        },
    }


def custom(cluster: Cluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(cluster.api)


async def create_job(cluster: Cluster, body: dict[str, Any]) -> dict[str, Any]:
    got: dict[str, Any] = await custom(cluster).create_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL, body
    )
    return got


async def get_job(cluster: Cluster, name: str) -> dict[str, Any]:
    got: dict[str, Any] = await custom(cluster).get_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL, name
    )
    return got


async def set_condition(cluster: Cluster, name: str, kind: str, message: str) -> None:
    """What the training-operator writes when the job reaches ``kind``."""
    condition = {
        "type": kind,
        "status": "True",
        "reason": f"PyTorchJob{kind}",
        "message": message,
        "lastUpdateTime": now(),
        "lastTransitionTime": now(),
    }
    running = {**condition, "type": "Running", "status": "False"}
    await merge_patch(
        custom(cluster).patch_namespaced_custom_object_status,
        GROUP,
        VERSION,
        cluster.namespace,
        PLURAL,
        name,
        body={"status": {"conditions": [running, condition]}},
    )


async def result_of(tap: Tap, plan_id: str, count: int = 1) -> list[ScaleResult]:
    async def found() -> list[ScaleResult] | None:
        got = [r for r in tap.of(ScaleResult) if r.plan_id == plan_id]
        return got if len(got) >= count else None

    return await until(found, f"{count} result(s) of plan {plan_id}")


def plan(env: str, job: JobView, plan_id: str, workers: int) -> ScalePlan:
    return ScalePlan(
        env=env,
        job=job_meta(job),
        source="test",
        plan_id=plan_id,
        node_group_resources={"worker": NodeGroupResource(count=workers)},
    )


async def pod_names(cluster: Cluster) -> list[str]:
    """The namespace's pods that nobody is deleting."""
    pods = await client.CoreV1Api(cluster.api).list_namespaced_pod(cluster.namespace)
    return sorted(p.metadata.name for p in pods.items if p.metadata.deletion_timestamp is None)


# ------------------------------------------------------------------------------------ CRD


async def test_pytorchjob_crd_is_structural_and_keeps_what_the_training_operator_reads(
    api: client.ApiClient, pytorchjob_crd: str, namespace: str
) -> None:
    ext = client.ApiextensionsV1Api(api)
    crd = await ext.read_custom_resource_definition(pytorchjob_crd)
    conditions = {c.type: c.status for c in crd.status.conditions}
    assert conditions["Established"] == "True"
    assert "NonStructuralSchema" not in conditions, crd.status.conditions
    (version,) = crd.spec.versions
    assert (crd.spec.group, version.name, crd.spec.names.kind) == (GROUP, VERSION, KIND)
    assert version.subresources.status is not None
    assert version.subresources.scale.spec_replicas_path == (
        ".spec.pytorchReplicaSpecs.Worker.replicas"
    )

    objects = client.CustomObjectsApi(api)
    name = unique_name("ptj")
    body = pytorchjob(name)
    body["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"] = {
        "annotations": {"sidecar.istio.io/inject": "false"}
    }
    await objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    got = await objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    # The pod template is kept whole (preserve-unknown-fields), not pruned.
    assert got["spec"]["pytorchReplicaSpecs"] == body["spec"]["pytorchReplicaSpecs"]
    assert got["spec"]["elasticPolicy"] == body["spec"]["elasticPolicy"]

    # The schema is enforced, and status is a subresource: a spec write cannot set it.
    bad = pytorchjob(unique_name("ptj"))
    bad["spec"]["elasticPolicy"]["rdzvBackend"] = "zookeeper"
    await expect_status(
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, bad), 422
    )
    await merge_patch(
        objects.patch_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        name,
        body={"status": {"conditions": [{"type": "Succeeded", "status": "True"}]}},
    )
    got = await objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    assert "status" not in got or not got["status"].get("conditions")
    doc = await objects.get_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name)
    assert not (doc.get("status") or {}).get("conditions")

    # Through the scale subresource, as `kubectl scale` and an HPA would.
    scale = await objects.get_namespaced_custom_object_scale(
        GROUP, VERSION, namespace, PLURAL, name
    )
    assert scale["spec"]["replicas"] == 2


# ----------------------------------------------------------------------------------- RBAC


def test_operator_role_grants_pytorchjobs_exactly_get_list_watch_patch() -> None:
    (role,) = [
        d for d in load_yaml_documents(DEPLOY / "rbac" / "operator.yaml") if d["kind"] == "Role"
    ]
    kubeflow = [r for r in role["rules"] if "kubeflow.org" in r["apiGroups"]]
    assert kubeflow == [
        {
            "apiGroups": ["kubeflow.org"],
            "resources": ["pytorchjobs"],
            "verbs": ["get", "list", "watch", "patch"],
        }
    ]
    pods = [r for r in role["rules"] if r["resources"] == ["pods"]]
    assert {"get", "list", "watch"} <= set(pods[0]["verbs"])


async def test_operator_rbac_allows_what_the_pytorchjob_path_calls_and_no_more(
    api: client.ApiClient, pytorchjob_crd: str, namespace: str
) -> None:
    await apply_rbac(api, namespace, "operator.yaml")
    name = unique_name("ptj")
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, pytorchjob(name)
    )
    sa_name = "dlrover-events-operator"
    async with await service_account_client(api, namespace, sa_name) as sa:
        objects = client.CustomObjectsApi(sa)
        kube = KubeApi(sa, PYTORCH_JOB, namespace)
        # Allowed: exactly what the operator calls for a PyTorchJob.
        items, version = await eventually_allowed(kube.list_jobs)
        assert [i["metadata"]["name"] for i in items] == [name]
        got = await kube.get_job(name)
        assert got is not None
        await kube.patch_job(name, {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3}}}})
        async for _ in kube.watch("jobs", version, 1):
            pass
        pods, _ = await kube.list_pods(PYTORCH_JOB.job_pod_selector(name))
        assert pods == []
        async for _ in kube.watch("pods", version, 1):
            pass

        # Denied: the training-operator's part (the status, creating and deleting jobs).
        other = pytorchjob(unique_name("ptj"))
        denied = [
            objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, other),
            objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name),
            merge_patch(
                objects.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                body={"status": {"conditions": []}},
            ),
            merge_patch(
                objects.patch_namespaced_custom_object_scale,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                body={"spec": {"replicas": 4}},
            ),
        ]
        for call in denied:
            await expect_forbidden(call, namespace, sa_name)
    got = await client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    assert got["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3


# ------------------------------------------------------------------------------ reconciler


async def test_a_plan_scales_a_pytorchjob_within_its_elastic_policy_and_its_status_becomes_events(
    pytorch: Cluster,
    env: str,
    tap: Tap,
    producer: Producer,
    kubelet: FakeKubelet,
) -> None:
    cluster = pytorch
    await cluster.start(env)
    name = unique_name("ptj")
    obj = await create_job(cluster, pytorchjob(name, replicas=2, low=1, high=4))
    uid = obj["metadata"]["uid"]
    # The training-operator's part: a pod per replica; the kubelet loop runs them.
    for index in (0, 1):
        await cluster.kube.create_pod(operator_pod(obj, index))

    submitted = await tap.until(lambda: tap.of(JobSubmitted, uid), "job.submitted")
    assert submitted[0].roles["worker"].replicas == 2
    assert (
        submitted[0].roles["worker"].min_replicas,
        submitted[0].roles["worker"].max_replicas,
    ) == (1, 4)
    await tap.until(lambda: len(tap.of(NodeStarted, uid)) >= 2, "node.started of 2 workers")
    started = tap.of(NodeStarted, uid)
    assert sorted((e.node.type, e.node.id, e.node.name) for e in started) == [
        ("worker", 0, f"{name}-worker-0"),
        ("worker", 1, f"{name}-worker-1"),
    ]
    await tap.until(lambda: tap.of(JobStarted, uid), "job.started")

    # A plan to 3: the Worker replicas are patched, the plan id recorded, no pod made.
    job = PYTORCH_JOB.parse(await get_job(cluster, name))
    up = plan(env, job, "up-3", 3)
    await producer.publish(up)
    await producer.publish(up.model_copy(update={"event_id": uuid.uuid4()}))
    first, second = await result_of(tap, "up-3", 2)
    assert first.status is ScaleStatus.APPLIED, first.reason
    assert first.reason == "worker 2->3"
    assert second.status is ScaleStatus.APPLIED
    assert second.reason == f"{ALREADY_APPLIED}: {first.reason}"
    got = await get_job(cluster, name)
    assert got["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    assert PYTORCH_JOB.parse(got).applied_plans.count("up-3") == 1
    assert '"up-3"' in got["metadata"]["annotations"][ANN_PLANS]
    # The template and the elastic policy are as the user wrote them.
    assert got["spec"]["elasticPolicy"] == obj["spec"]["elasticPolicy"]
    assert (
        got["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
        == (obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"])
    )
    assert await pod_names(cluster) == [f"{name}-worker-0", f"{name}-worker-1"]
    assert not (got.get("status") or {}), "the status is the training-operator's"

    # A plan to 6, above the elastic policy's maxReplicas: rejected, saying so.
    job = PYTORCH_JOB.parse(got)
    await producer.publish(plan(env, job, "up-6", 6))
    (rejected,) = await result_of(tap, "up-6")
    assert rejected.status is ScaleStatus.REJECTED
    assert "above maxReplicas 4" in rejected.reason, rejected.reason
    got = await get_job(cluster, name)
    assert got["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3

    # The training-operator makes worker-2; the kubelet fails worker-1.
    await cluster.kube.create_pod(operator_pod(obj, 2))
    await tap.first(NodeStarted, uid, lambda e: e.node.id == 2, "node.started of worker-2")
    await until(lambda: _running(cluster, f"{name}-worker-1"), "worker-1 running")
    await kubelet.failed(cluster.namespace, f"{name}-worker-1", exit_code=3)
    failed = await tap.first(NodeFailed, uid, lambda e: e.node.id == 1, "node.failed of worker-1")
    assert (failed.node.type, failed.exit_code) == ("worker", 3)

    # The training-operator says the job succeeded: the brain hears job.completed.
    assert tap.of(JobCompleted, uid) == []
    await set_condition(cluster, name, "Succeeded", f"PyTorchJob {name} is successfully completed.")
    (completed,) = await tap.until(lambda: tap.of(JobCompleted, uid), "job.completed")
    assert completed.job.name == name

    # A finished job takes no more plans; and its pods stay the training-operator's.
    job = PYTORCH_JOB.parse(await get_job(cluster, name))
    await producer.publish(plan(env, job, "late", 2))
    (late,) = await result_of(tap, "late")
    assert late.status is ScaleStatus.REJECTED
    assert "succeeded" in late.reason
    await custom(cluster).delete_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL, name
    )
    await until(lambda: _gone(cluster, name), "the job deleted")
    await cluster.running[0].reconciler.reconcile(name)
    assert await pod_names(cluster) == [f"{name}-worker-{i}" for i in range(3)]


async def _running(cluster: Cluster, pod: str) -> bool:
    got = await client.CoreV1Api(cluster.api).read_namespaced_pod(pod, cluster.namespace)
    return bool(got.status.phase == "Running")


async def _gone(cluster: Cluster, name: str) -> bool:
    return await cluster.kube.get_job(name) is None
