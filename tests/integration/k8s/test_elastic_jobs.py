"""Elastic TrainingJobs, GPU resources and job identity on the real kube-apiserver v1.20.2.

The operator runs as its own ServiceAccount under deploy/rbac/operator.yaml, so what it
does here is also what its Role allows. The test plays kubelet and scheduler (there are
none): pods are bound and started as they come, and a deletion is confirmed once the
kubelet loop has seen the grace period it asked for.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from dlrover_events.bus.producer import Producer
from dlrover_events.settings import Settings
from handlers.operator.document.quantity import GPU
from handlers.operator.document.trainingjob import UNSUPPORTED
from handlers.operator.kube.client import KubeApi
from handlers.operator.kube.pods import LABEL_RANK
from handlers.operator.kube.trainingjob import (
    DEFAULT_GPU_TYPE_LABEL,
    TRAINING_JOB,
    rendezvous_service,
)
from handlers.operator.platform.bodies import OperatorJobStatus, PodView
from handlers.operator.reconcile.reconciler import ALREADY_APPLIED
from schemas.jobs import JobSubmitted, NodeRef
from schemas.plans import (
    MigrateNode,
    NodeGroupResource,
    NodeResource,
    RescaleMode,
    ScaleResult,
    ScaleStatus,
)
from tests.integration.tap import Tap

from .kube import GROUP, PLURAL, VERSION
from .test_kube_testenv import apply_rbac, service_account_client
from .test_reconciler import ledger_row, result_of
from .test_reconciler_support import Cluster, role, until

pytestmark = pytest.mark.integration

OPERATOR_SA = "dlrover-events-operator"
GRACE_S = 45
PORT = 29500
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


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
async def as_operator(cluster: Cluster, api: client.ApiClient) -> AsyncIterator[Cluster]:
    """The cluster fixture with the reconciler's calls made as the operator's
    ServiceAccount (its Role applied in the test's namespace), its GPU type label on."""
    await apply_rbac(api, cluster.namespace, "operator.yaml")
    sa = await service_account_client(api, cluster.namespace, OPERATOR_SA)
    async with sa:
        adapter = TRAINING_JOB.configured(gpu_type_label=DEFAULT_GPU_TYPE_LABEL)
        cluster.kube = KubeApi(sa, adapter, cluster.namespace)
        await until(_allowed(cluster), "the operator's Role in force")
        yield cluster


def _allowed(cluster: Cluster) -> Any:
    async def check() -> bool:
        try:
            await cluster.kube.list_services("a=b")
        except client.ApiException as e:
            if e.status == 403:
                return False
            raise
        return True

    return check


def elastic_worker(replicas: int) -> dict[str, Any]:
    return role(
        replicas,
        minReplicas=1,
        maxReplicas=4,
        elastic={"command": ["python", "train.py"], "rendezvousPort": PORT},
        template={
            "metadata": {"labels": {"team": "vision"}},
            "spec": {
                "terminationGracePeriodSeconds": GRACE_S,
                "containers": [
                    {
                        "name": "trainer",
                        "image": "train:1.0",
                        "env": [{"name": "WORLD_SIZE", "value": "99"}],
                    }
                ],
            },
        },
    )


async def create_job(
    cluster: Cluster, roles: dict[str, Any], labels: dict[str, str] | None = None
) -> str:
    name = f"job-{uuid.uuid4().hex[:8]}"
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"roles": roles},
    }
    await client.CustomObjectsApi(cluster.api).create_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL, body
    )
    return name


async def services(cluster: Cluster, name: str) -> list[Any]:
    got = await client.CoreV1Api(cluster.api).list_namespaced_service(
        cluster.namespace, label_selector=f"dlrover-events.io/job={name}"
    )
    return list(got.items)


async def printer_row(cluster: Cluster, name: str) -> dict[str, Any]:
    """The job as `kubectl get tj` shows it: the API server's own Table of the CRD's
    additionalPrinterColumns."""
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{cluster.namespace}/{PLURAL}/{name}"
    resp = await cluster.api.call_api(
        path,
        "GET",
        header_params={"Accept": TABLE},
        auth_settings=["BearerToken"],
        _preload_content=False,
    )
    try:
        table = json.loads(await resp.read())
    finally:
        resp.release()
    assert "columnDefinitions" in table, table.get("message")
    columns = [c["name"] for c in table["columnDefinitions"]]
    (row,) = table["rows"]
    return dict(zip(columns, row["cells"], strict=True))


def env_of(container: Any) -> dict[str, str]:
    return {e.name: e.value for e in container.env or []}


async def test_an_elastic_job_resizes_2_4_1_around_its_rendezvous_host(
    as_operator: Cluster, env: str, tap: Tap, producer: Producer, pg_dsn: str
) -> None:
    cluster = as_operator
    await cluster.start(env)
    name = await create_job(cluster, {"worker": elastic_worker(2)})
    await until(lambda: cluster.workers_running(name, 2), "2 running workers")
    job = await cluster.job(name)
    assert job is not None

    # The Service: headless, owned by the job, resolving to exactly the rank-0 pod.
    # (and the role's own Service, under which each pod has its rank's name: test_multirole)
    by_name = {s.metadata.name: s for s in await services(cluster, name)}
    assert set(by_name) == {f"{name}-worker-rdzv", f"{name}-worker"}
    svc = by_name[f"{name}-worker-rdzv"]
    assert svc.metadata.name == rendezvous_service(job, "worker") == f"{name}-worker-rdzv"
    assert svc.spec.cluster_ip == "None"
    assert svc.spec.publish_not_ready_addresses is True
    assert [(p.name, p.port) for p in svc.spec.ports] == [("rendezvous", PORT)]
    (owner,) = svc.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid) == ("TrainingJob", name, job.uid)
    selector = ",".join(f"{k}={v}" for k, v in sorted(svc.spec.selector.items()))
    selected, _ = await cluster.kube.list_pods(selector)
    assert [p["metadata"]["name"] for p in selected] == [f"{name}-worker-0"]

    # The pods: torchrun around the training command, the Service as endpoint, no frozen
    # world size (the template's own WORLD_SIZE is left for torchrun to override).
    for rank in (0, 1):
        pod = await cluster.raw_pod(f"{name}-worker-{rank}")
        (container,) = pod.spec.containers
        command = container.command
        assert command[0] == "torchrun"
        assert "--nnodes=1:4" in command
        assert f"--rdzv-endpoint={svc.metadata.name}:{PORT}" in command
        assert any(a.startswith(f"--rdzv-conf=is_host={int(rank == 0)},") for a in command)
        assert command[-2:] == ["python", "train.py"]
        variables = env_of(container)
        assert "DLROVER_EVENTS_WORLD_SIZE" not in variables
        assert variables["DLROVER_EVENTS_RANK"] == str(rank)
        assert pod.spec.termination_grace_period_seconds == GRACE_S
    host_uid = (await cluster.raw_pod(f"{name}-worker-0")).metadata.uid

    meta = await cluster.meta(name)
    loop = cluster.kubelet_loop  # type: ignore[attr-defined]
    for plan_id, count in (("to-4", 4), ("to-1", 1)):
        plan = cluster.plan(
            env, meta, plan_id, node_group_resources={"worker": NodeGroupResource(count=count)}
        )
        await producer.publish(plan)
        (result,) = await result_of(tap, plan_id)
        assert result.status is ScaleStatus.APPLIED, result.reason
        pods = await until(lambda c=count: cluster.workers_running(name, c), f"{count} workers")
        assert [p.rank for p in pods] == list(range(count))
        (host,) = [p for p in pods if p.rank == 0]
        assert host.uid == host_uid  # never the rendezvous host
    removed = {f"{name}-worker-{r}" for r in (1, 2, 3)}

    async def confirmed() -> bool:  # the kubelet loop has seen every deletion
        return len(await cluster.all_pods(name)) == 1

    await until(confirmed, "the removed pods' deletions confirmed")
    assert {n: g for n, g in loop.graces.items() if n in removed} == dict.fromkeys(removed, GRACE_S)

    # Each plan applied once: delivered again, answered as first, nothing moves.
    await producer.publish(
        cluster.plan(env, meta, "to-4", node_group_resources={"worker": NodeGroupResource(count=4)})
    )
    _, again = await result_of(tap, "to-4", 2)
    assert again.reason.startswith(ALREADY_APPLIED)
    for plan_id in ("to-4", "to-1"):
        row = await ledger_row(pg_dsn, env, plan_id)
        assert row is not None and row["status"] == "applied"
    job = await cluster.job(name)
    assert job is not None
    assert [job.applied_plans.count(p) for p in ("to-4", "to-1")] == [1, 1]
    assert job.roles["worker"].replicas == 1
    assert len(await cluster.pods(name)) == 1

    async def settled() -> OperatorJobStatus | None:
        got = await cluster.job(name)
        ok = got is not None and got.phase == "Running" and got.last_plan_id == "to-1"
        return got.status if got is not None and ok else None

    status = await until(settled, "status Running after plan to-1")
    assert status.roles["worker"] == {"pending": 0, "running": 1, "succeeded": 0, "failed": 0}
    row = await printer_row(cluster, name)
    assert (row["Phase"], row["Workers"], row["Running"], row["Last-Plan"]) == (
        "Running",
        1,
        1,
        "to-1",
    )

    # Deleted with the job: its pods and its Service (this API server has no garbage
    # collector; the operator does not wait for one).
    await client.CustomObjectsApi(cluster.api).delete_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL, name
    )

    async def gone() -> bool:
        return not await services(cluster, name) and not await cluster.all_pods(name)

    await until(gone, "the deleted job's Service and pods gone")


async def test_gpu_count_and_type_are_applied_and_gpu_memory_refused(
    as_operator: Cluster, env: str, tap: Tap, producer: Producer
) -> None:
    cluster = as_operator
    await cluster.start(env)
    worker = role(
        1,
        container="trainer",
        resources={"cpu": 2, "memory": "4Gi", GPU: 1},
        template={
            "spec": {
                "containers": [
                    {
                        "name": "sidecar",
                        "image": "log:1.0",
                        "resources": {"limits": {"cpu": "100m"}},
                    },
                    {
                        "name": "trainer",
                        "image": "train:1.0",
                        "resources": {"limits": {"ephemeral-storage": "1Gi"}},
                    },
                ]
            }
        },
    )
    name = await create_job(cluster, {"worker": worker})
    await until(lambda: cluster.workers_running(name, 1), "1 running worker")
    pod = await cluster.raw_pod(f"{name}-worker-0")
    sidecar, trainer = pod.spec.containers
    assert sidecar.resources.limits == {"cpu": "100m"}
    assert trainer.resources.limits == {
        "cpu": "2",
        "memory": str(4 * 2**30),
        GPU: "1",
        "ephemeral-storage": "1Gi",
    }
    assert not pod.spec.node_selector

    meta = await cluster.meta(name)
    plan = cluster.plan(
        env,
        meta,
        "gpus",
        node_group_resources={
            "worker": NodeGroupResource(
                count=2,
                node_resource=NodeResource(gpu_num=2, gpu_type="NVIDIA-A100", gpu_memory=2**30),
            )
        },
    )
    await producer.publish(plan)
    (result,) = await result_of(tap, "gpus")
    assert result.status is ScaleStatus.PARTIAL, result.reason
    assert [(p.part, p.reason) for p in result.not_applied] == [
        ("worker.gpu_memory", UNSUPPORTED["gpu_memory"])
    ]
    assert "cannot request GPU memory" in result.not_applied[0].reason

    # The role's new resources are for its new pods (rank 1); rank 0 moves by a migrate.
    async def on_a100(ranks: tuple[int, ...]) -> list[PodView] | None:
        pods = await cluster.workers_running(name, 2)
        ok = pods and all(
            (p.resources.gpu, p.resources.gpu_type) == (2, "NVIDIA-A100")
            for p in pods
            if p.rank in ranks
        )
        return pods if ok else None

    pods = await until(lambda: on_a100((1,)), "worker-1 with 2 GPUs of type NVIDIA-A100")
    assert (pods[0].resources.gpu, pods[0].resources.gpu_type) == (1, None)
    migrate = cluster.plan(
        env,
        meta,
        "move-0",
        migrate_nodes=[
            MigrateNode(
                node=NodeRef(type="worker", id=0),
                resource=NodeResource(gpu_num=2, gpu_type="NVIDIA-A100"),
            )
        ],
    )
    await producer.publish(migrate)
    (moved,) = await result_of(tap, "move-0")
    assert (moved.status, moved.not_applied) == (ScaleStatus.APPLIED, []), moved.reason
    pods = await until(lambda: on_a100((0, 1)), "both workers on 2 NVIDIA-A100 GPUs")
    assert [p.rank for p in pods] == [0, 1]
    for p in pods:
        raw = await cluster.raw_pod(p.name)
        assert raw.spec.node_selector == {DEFAULT_GPU_TYPE_LABEL: "NVIDIA-A100"}
        assert raw.spec.containers[1].resources.limits[GPU] == "2"
        assert GPU not in (raw.spec.containers[0].resources.limits or {})
    job = await cluster.job(name)
    assert job is not None
    assert job.roles["worker"].resources.gpu_type == "NVIDIA-A100"
    assert len([r for r in tap.of(ScaleResult) if r.plan_id == "gpus"]) == 1


async def test_a_jobs_identity_labels_reach_its_events_and_pods(
    cluster: Cluster, env: str, tap: Tap
) -> None:
    await cluster.start(env)
    labels = {
        "dlrover-events.io/user": "alice",
        "dlrover-events.io/group": "vision",
        "dlrover-events.io/cluster": "gpu-a",
        "dlrover-events.io/scenario": "resnet50-imagenet",
        "dlrover-events.io/app": "resnet",
    }
    name = await create_job(cluster, {"worker": role(1)}, labels)
    await until(lambda: cluster.workers_running(name, 1), "1 running worker")
    job = await cluster.job(name)
    assert job is not None
    (sub,) = await tap.until(lambda: tap.of(JobSubmitted, job.uid), "job.submitted")
    assert (sub.job.user, sub.job.group, sub.job.cluster, sub.job.scenario, sub.job.app) == (
        "alice",
        "vision",
        "gpu-a",
        "resnet50-imagenet",
        "resnet",
    )
    pod = await cluster.raw_pod(f"{name}-worker-0")
    variables = env_of(pod.spec.containers[0])
    assert variables["DLROVER_EVENTS_USER"] == "alice"
    assert variables["DLROVER_EVENTS_GROUP"] == "vision"
    assert variables["DLROVER_EVENTS_CLUSTER"] == "gpu-a"
    assert variables["DLROVER_EVENTS_SCENARIO"] == "resnet50-imagenet"
    assert variables["DLROVER_EVENTS_APP"] == "resnet"
    assert pod.metadata.labels[LABEL_RANK] == "0"


async def test_an_in_place_role_on_the_api_server(
    as_operator: Cluster, env: str, tap: Tap, producer: Producer
) -> None:
    """elastic.mode inPlace through the real API server: the CRD takes it (and refuses a
    mode it does not know), each pod runs a standalone agent that knows the job's
    membership store behind the role's Service, and a resize's result says in place."""
    cluster = as_operator
    await cluster.start(env)
    worker = elastic_worker(2)
    worker["elastic"] = {**worker["elastic"], "mode": "sideways"}
    with pytest.raises(client.ApiException) as refused:
        await create_job(cluster, {"worker": worker})
    assert refused.value.status == 422 and "sideways" in str(refused.value.body)
    worker["elastic"]["mode"] = "inPlace"
    name = await create_job(cluster, {"worker": worker})
    await until(lambda: cluster.workers_running(name, 2), "2 running workers")
    job = await cluster.job(name)
    assert job is not None
    policy = job.roles["worker"].elastic
    assert policy is not None and policy.in_place and policy.spares == 0  # the CRD's default
    store = f"{rendezvous_service(job, 'worker')}:{PORT}"
    for rank in (0, 1):
        (container,) = (await cluster.raw_pod(f"{name}-worker-{rank}")).spec.containers
        assert container.command[:2] == ["torchrun", "--standalone"]
        assert not any(a.startswith("--rdzv") for a in container.command)
        variables = env_of(container)
        assert variables["DLROVER_EVENTS_ELASTIC_STORE"] == store
        assert variables["DLROVER_EVENTS_ELASTIC_EXPECT"] == "2"
        assert variables.get("DLROVER_EVENTS_ELASTIC_STORE_HOST") == ("1" if rank == 0 else None)
    meta = await cluster.meta(name)
    plan = cluster.plan(
        env, meta, "to-3", node_group_resources={"worker": NodeGroupResource(count=3)}
    )
    await producer.publish(plan)
    (result,) = await result_of(tap, "to-3")
    assert result.status is ScaleStatus.APPLIED, result.reason
    assert result.rescale_mode is RescaleMode.IN_PLACE
    await until(lambda: cluster.workers_running(name, 3), "3 workers")
