"""The TrainingJob adapter (deploy/crds/trainingjobs.yaml): this operator creates the pods.

A pod is the role's template with what the operator owns put on top: its name and labels
(job, job uid, role, rank, index), requests = limits = the node's resources on the role's
container (``container``, else the first), its GPU type as a node selector on the
operator's GPU type label, the SDK's identity variables (the job's user, group, cluster,
scenario and app from its labels too), restartPolicy Never (a pod that ends is replaced
by the operator, by the role's restartPolicy, under a new index) and an owner reference,
so that on a cluster with a garbage collector deleting the job deletes its pods.

An elastic role also gets a headless Service that resolves to its rendezvous host pod
(rank 0), owned by the job like its pods.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dlrover_events.sdk.identity import (
    APP_ENV,
    CLUSTER_ENV,
    ELASTIC_EXPECT_ENV,
    ELASTIC_STORE_ENV,
    ELASTIC_STORE_HOST_ENV,
    ENV_ENV,
    GROUP_ENV,
    JOB_ID_ENV,
    JOB_NAME_ENV,
    LABELS_ENV,
    NAMESPACE_ENV,
    RANK_ENV,
    ROLE_ENV,
    SCENARIO_ENV,
    USER_ENV,
    WORLD_SIZE_ENV,
)
from handlers.operator.kube.adapter import PodCreatingAdapter, register_adapter
from handlers.operator.kube.wiring import PodWiring
from handlers.operator.reconcile import planning
from handlers.operator.reconcile.planning import NewPod, PlanChange
from handlers.operator.trainingjob import (
    ANN_CONTAINER,
    ANN_GPU_TYPE,
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_JOB_UID,
    LABEL_MANAGED_BY,
    LABEL_RANK,
    LABEL_ROLE,
    MANAGED_BY,
    JobView,
    PodView,
    RoleView,
    parse_job,
    parse_pod,
    pod_name,
)
from schemas.plans import NotApplied, ScalePlan

GROUP = "dlrover-events.io"
VERSION = "v1alpha1"
PLURAL = "trainingjobs"
KIND = "TrainingJob"


#: The node label a cluster names its nodes' GPU types with (NVIDIA's GPU feature
#: discovery); the Kubernetes operator's default (DLROVER_EVENTS_OPERATOR_GPU_TYPE_LABEL).
DEFAULT_GPU_TYPE_LABEL = "nvidia.com/gpu.product"

#: The job's identity labels -> the SDK's variables (dlrover_events.sdk.identity).
IDENTITY_ENV = {
    "user": USER_ENV,
    "group": GROUP_ENV,
    "cluster": CLUSTER_ENV,
    "scenario": SCENARIO_ENV,
    "app": APP_ENV,
}


class TrainingJobAdapter(PodCreatingAdapter):
    """``gpu_type_label``: the node label GPU types are selected by; None (the local
    platform, which has no nodes to select) leaves a plan's GPU type not applied."""

    kind = KIND
    group = GROUP
    version = VERSION
    plural = PLURAL

    def __init__(self, gpu_type_label: str | None = None, wiring: PodWiring | None = None) -> None:
        self.gpu_type_label = gpu_type_label or None
        self.wiring = wiring

    def configured(
        self, *, gpu_type_label: str | None, wiring: PodWiring | None = None
    ) -> TrainingJobAdapter:
        return TrainingJobAdapter(gpu_type_label, wiring)

    def plan_not_applied(self, plan: ScalePlan) -> tuple[NotApplied, ...]:
        return planning.plan_not_applied(plan, self.gpu_type_label)

    def services(
        self, obj: Mapping[str, Any], job: JobView, *, rendezvous_host: str | None = None
    ) -> list[dict[str, Any]]:
        return [] if rendezvous_host else rendezvous_services(obj, job)

    def parse(self, obj: Mapping[str, Any]) -> JobView:
        return parse_job(obj)

    def parse_pod(self, obj: Mapping[str, Any]) -> PodView | None:
        return parse_pod(obj)

    def pod_selector(self) -> str:
        return f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_JOB}"

    def plan_change(self, job: JobView, pods: Sequence[PodView], plan: ScalePlan) -> PlanChange:
        return planning.plan_change(job, pods, plan, gpu_type_label=self.gpu_type_label)

    def pod_manifest(
        self,
        obj: Mapping[str, Any],
        job: JobView,
        pod: NewPod,
        env: str,
        *,
        rendezvous_host: str | None = None,
    ) -> dict[str, Any]:
        return pod_manifest(
            obj,
            job,
            pod,
            env,
            rendezvous_host=rendezvous_host,
            gpu_type_label=self.gpu_type_label,
            wiring=self.wiring,
        )

    def status_patch(
        self,
        job: JobView,
        pods: Sequence[PodView],
        *,
        last_plan: str | None = None,
        last_plan_time: str | None = None,
    ) -> dict[str, Any] | None:
        return planning.status_patch(job, pods, last_plan=last_plan, last_plan_time=last_plan_time)


#: Seconds a rendezvous waits for more nodes once it has its minimum (torch's default is
#: 30): a resize is one node more or fewer, and every second here is a second the whole
#: job does not train.
LAST_CALL_S = 3
#: A removed node's agent leaves without a word; the others wait for its heartbeat to
#: lapse (torch's default 5 s x 3) before they re-rendezvous smaller: 2 s x 3 here.
KEEP_ALIVE_S = 2
KEEP_ALIVE_MISSES = 3


#: torchrun's agents otherwise share the rendezvous store with the workers, and then a
#: node that joins a running job waits for ever for a worker-store address the old rank-0
#: agent never publishes again (torch 2.13: RendezvousStoreInfo.build in the new round's
#: prefix); a scale-up hung, measured on the local platform, until the store timed out.
ELASTIC_AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_SERVICE_SUFFIX = "-rdzv"


def rendezvous_service(job: JobView, role: str) -> str:
    """The headless Service an elastic role's pods rendezvous at, on a cluster:
    ``<job>-<role>-rdzv``, or, where that is no DNS-1035 label of at most 63 characters
    (a Service name must be one; a job's name may be longer, or hold dots), the job's
    name cut short with a digest of job and role, so that it stays unique and stable."""
    name = f"{job.name}-{role}{_SERVICE_SUFFIX}"
    if len(name) <= 63 and _DNS_1035.match(name):
        return name
    digest = hashlib.sha256(f"{job.name}/{role}".encode()).hexdigest()[:10]
    stem = re.sub(r"[^a-z0-9-]+", "-", job.name.lower()).strip("-")
    stem = re.sub(r"^[^a-z]+", "", stem)[: 63 - len(digest) - len(_SERVICE_SUFFIX) - 2]
    return f"{stem.rstrip('-') or 'job'}-{digest}{_SERVICE_SUFFIX}"


def _owner(obj: Mapping[str, Any], job: JobView) -> dict[str, Any]:
    """The job as owner: a cluster's garbage collector deletes what it owns with it."""
    return {
        "apiVersion": obj.get("apiVersion") or f"{GROUP}/{VERSION}",
        "kind": obj.get("kind") or KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": False,
    }


def host_selector(job: JobView, role: str, host_rank: int) -> dict[str, str]:
    """The labels of exactly the role's rendezvous host pod of this job (not of an
    earlier job of the same name: the uid is in it). A replacement of that pod has the
    same rank, so the name follows it; a pod that ended is no endpoint."""
    return {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_JOB_UID: job.uid,
        LABEL_ROLE: role,
        LABEL_RANK: str(host_rank),
    }


def rendezvous_services(obj: Mapping[str, Any], job: JobView) -> list[dict[str, Any]]:
    """One headless Service per elastic role, resolving to its host pod's address.

    Headless (clusterIP None): the name resolves straight to the pod, so the c10d store's
    TCP connections go to the pod, with no proxy between. ``publishNotReadyAddresses``:
    the other nodes must find the store as soon as the host pod has an address, before
    any readiness a template may define (the store is what makes the job ready).
    """
    out = []
    for name, role in sorted(job.roles.items()):
        if role.elastic is None:
            continue
        port = role.elastic.rendezvous_port
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": rendezvous_service(job, name),
                    "namespace": job.namespace,
                    "labels": {
                        LABEL_MANAGED_BY: MANAGED_BY,
                        LABEL_JOB: job.name,
                        LABEL_JOB_UID: job.uid,
                        LABEL_ROLE: name,
                    },
                    "ownerReferences": [_owner(obj, job)],
                },
                "spec": {
                    "clusterIP": "None",
                    "selector": host_selector(job, name, role.elastic.host_rank),
                    "publishNotReadyAddresses": True,
                    "ports": [
                        {"name": "rendezvous", "port": port, "targetPort": port, "protocol": "TCP"}
                    ],
                },
            }
        )
    return out


def training_container(role: RoleView, containers: Sequence[Mapping[str, Any]]) -> int:
    """The index of the role's container (its ``container``, else the first)."""
    if role.container is not None:
        for i, c in enumerate(containers):
            if c.get("name") == role.container:
                return i
    return 0


def elastic_command(
    job: JobView, role: RoleView, pod: NewPod, rendezvous_host: str, command: Sequence[str]
) -> list[str]:
    """torchrun's elastic agent around the training command: ``--nnodes=MIN:MAX`` and a c10d
    rendezvous, never a frozen world size. The role's host rank binds the store
    (``is_host=1``); the others only connect, so the store lives as long as that pod.

    In place, each pod's agent only supervises its own workers (``--standalone``: a
    rendezvous of its own, restarting a worker that fails); the workers form the job's
    group themselves (``in_place_env``)."""
    policy = role.elastic
    assert policy is not None
    if policy.in_place:
        return [
            "torchrun",
            "--standalone",
            "--nnodes=1",
            f"--nproc-per-node={policy.nproc_per_node}",
            f"--max-restarts={policy.max_restarts}",
            "--monitor-interval=1",
            "--no-python",
            *command,
        ]
    low = role.min_replicas if role.min_replicas is not None else role.replicas
    high = role.max_replicas if role.max_replicas is not None else max(role.replicas, low)
    is_host = 1 if pod.rank == policy.host_rank else 0
    return [
        "torchrun",
        f"--nnodes={max(1, low)}:{max(1, low, high)}",
        f"--nproc-per-node={policy.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rendezvous_host}:{policy.rendezvous_port}",
        f"--rdzv-id={job.uid}",
        f"--rdzv-conf=is_host={is_host},last_call_timeout={LAST_CALL_S},"
        f"keep_alive_interval={KEEP_ALIVE_S},keep_alive_max_attempt={KEEP_ALIVE_MISSES}",
        f"--max-restarts={policy.max_restarts}",
        "--monitor-interval=1",
        "--no-python",
        *command,
    ]


def in_place_env(role: RoleView, rank: int, rendezvous_host: str) -> dict[str, str]:
    """What an in-place role's workers need to form the job's group: its membership store
    (hosted by the host rank's worker, on the rendezvous port), and how many members the
    first generation waits for."""
    policy = role.elastic
    assert policy is not None
    assert policy.in_place
    env = {
        ELASTIC_STORE_ENV: f"{rendezvous_host}:{policy.rendezvous_port}",
        ELASTIC_EXPECT_ENV: str(max(role.replicas, 1) * policy.nproc_per_node),
    }
    if rank == policy.host_rank:
        env[ELASTIC_STORE_HOST_ENV] = "1"
    return env


def pod_manifest(
    obj: Mapping[str, Any],
    job: JobView,
    pod: NewPod,
    env: str,
    *,
    rendezvous_host: str | None = None,
    gpu_type_label: str | None = None,
    wiring: PodWiring | None = None,
) -> dict[str, Any]:
    """The pod of one node of a job (pure: the same inputs give the same pod).

    An elastic role's container runs its training command under torchrun, which sets
    RANK and WORLD_SIZE per rendezvous: the pod gets no world size of its own, only its
    node rank (the brain's node id), which stays the same across re-rendezvous. The
    node's resources go on that container, merged over what its template asks (other
    resources of the template stay); a GPU type becomes a node selector on
    ``gpu_type_label`` (without one, none: the plan said so, see plan_not_applied).
    ``wiring``: where the pod's SDK finds the bus and the gateway (`wiring.PodWiring`).
    """
    role = job.roles[pod.role]
    template = copy.deepcopy(dict(role.template))
    tmeta = template.get("metadata") or {}
    spec: dict[str, Any] = template.get("spec") or {}
    labels = {
        **(tmeta.get("labels") or {}),
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_JOB: job.name,
        LABEL_JOB_UID: job.uid,
        LABEL_ROLE: pod.role,
        LABEL_RANK: str(pod.rank),
        LABEL_INDEX: str(pod.index),
    }
    identity = {
        JOB_ID_ENV: job.uid,
        JOB_NAME_ENV: job.name,
        ROLE_ENV: pod.role,
        RANK_ENV: str(pod.rank),
        ENV_ENV: env,
        NAMESPACE_ENV: job.namespace,
    }
    for attr, value in job.identity().items():
        identity[IDENTITY_ENV[attr]] = value
    if job.labels:
        identity[LABELS_ENV] = ",".join(f"{k}={v}" for k, v in sorted(job.labels.items()))
    host = rendezvous_host or rendezvous_service(job, pod.role)
    if role.elastic is None:
        identity[WORLD_SIZE_ENV] = str(role.replicas)
    elif role.elastic.in_place:
        identity.update(in_place_env(role, pod.rank, host))
    else:
        identity.update(ELASTIC_AGENT_ENV)
    containers = spec.get("containers") or []
    chosen = training_container(role, containers)
    annotations = dict(tmeta.get("annotations") or {})
    for i, container in enumerate(containers):
        env_vars = [e for e in container.get("env") or [] if e.get("name") not in identity]
        container["env"] = env_vars + [{"name": k, "value": v} for k, v in identity.items()]
        if i != chosen:
            continue
        if role.elastic is not None:
            training = list(role.elastic.command) or [
                *(container.get("command") or []),
                *(container.get("args") or []),
            ]
            container["command"] = elastic_command(job, role, pod, host, training)
            container.pop("args", None)
        quantities = pod.resources.to_quantities()
        if quantities:
            asked = container.get("resources") or {}
            container["resources"] = {
                **asked,
                "requests": {**(asked.get("requests") or {}), **quantities},
                "limits": {**(asked.get("limits") or {}), **quantities},
            }
        if role.container is not None:
            annotations[ANN_CONTAINER] = role.container
    if wiring is not None:
        wiring.apply(spec, env)
    if pod.resources.gpu_type is not None and gpu_type_label:
        spec["nodeSelector"] = {
            **(spec.get("nodeSelector") or {}),
            gpu_type_label: pod.resources.gpu_type,
        }
        annotations[ANN_GPU_TYPE] = pod.resources.gpu_type
    spec["restartPolicy"] = "Never"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(job.name, pod.role, pod.index),
            "namespace": job.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [_owner(obj, job)],
        },
        "spec": spec,
    }


TRAINING_JOB = register_adapter(TrainingJobAdapter())

__all__ = [
    "DEFAULT_GPU_TYPE_LABEL",
    "GROUP",
    "IDENTITY_ENV",
    "KIND",
    "PLURAL",
    "TRAINING_JOB",
    "VERSION",
    "TrainingJobAdapter",
    "elastic_command",
    "host_selector",
    "in_place_env",
    "pod_manifest",
    "rendezvous_service",
    "rendezvous_services",
    "training_container",
]
