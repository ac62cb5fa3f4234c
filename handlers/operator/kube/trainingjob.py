"""The TrainingJob adapter (deploy/crds/trainingjobs.yaml): this operator creates the pods.

A pod is the role's template with what the operator owns put on top: its name and labels
(job, job uid, role, rank, index), requests = limits = the node's resources on the first
container, the SDK's identity variables, restartPolicy Never (a pod that ends is replaced
by the operator, by the role's restartPolicy, under a new index) and an owner reference,
so that on a cluster with a garbage collector deleting the job deletes its pods.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from dlrover_events.sdk.identity import (
    ENV_ENV,
    JOB_ID_ENV,
    JOB_NAME_ENV,
    NAMESPACE_ENV,
    RANK_ENV,
    ROLE_ENV,
    WORLD_SIZE_ENV,
)
from handlers.operator.kube import planning
from handlers.operator.kube.adapter import WorkloadAdapter, register_adapter
from handlers.operator.kube.model import (
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
from handlers.operator.kube.planning import NewPod, PlanChange
from schemas.plans import ScalePlan

GROUP = "dlrover-events.io"
VERSION = "v1alpha1"
PLURAL = "trainingjobs"
KIND = "TrainingJob"


class TrainingJobAdapter(WorkloadAdapter):
    kind = KIND
    group = GROUP
    version = VERSION
    plural = PLURAL
    creates_pods = True

    def parse(self, obj: Mapping[str, Any]) -> JobView:
        return parse_job(obj)

    def parse_pod(self, obj: Mapping[str, Any]) -> PodView | None:
        return parse_pod(obj)

    def pod_selector(self) -> str:
        return f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_JOB}"

    def plan_change(self, job: JobView, pods: Sequence[PodView], plan: ScalePlan) -> PlanChange:
        return planning.plan_change(job, pods, plan)

    def pod_manifest(
        self,
        obj: Mapping[str, Any],
        job: JobView,
        pod: NewPod,
        env: str,
        *,
        rendezvous_host: str | None = None,
    ) -> dict[str, Any]:
        return pod_manifest(obj, job, pod, env, rendezvous_host=rendezvous_host)

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


def rendezvous_service(job: JobView) -> str:
    """The headless Service a job's elastic pods rendezvous at, on a cluster."""
    return f"{job.name}-rendezvous"


def elastic_command(
    job: JobView, role: RoleView, pod: NewPod, rendezvous_host: str, command: Sequence[str]
) -> list[str]:
    """torchrun's elastic agent around the training command: ``--nnodes=MIN:MAX`` and a c10d
    rendezvous, never a frozen world size. The role's host rank binds the store
    (``is_host=1``); the others only connect, so the store lives as long as that pod."""
    policy = role.elastic
    assert policy is not None
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


def pod_manifest(
    obj: Mapping[str, Any],
    job: JobView,
    pod: NewPod,
    env: str,
    *,
    rendezvous_host: str | None = None,
) -> dict[str, Any]:
    """The pod of one node of a job (pure: the same inputs give the same pod).

    An elastic role's first container runs its training command under torchrun, which
    sets RANK and WORLD_SIZE per rendezvous: the pod gets no world size of its own, only
    its node rank (the brain's node id), which stays the same across re-rendezvous.
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
    if role.elastic is None:
        identity[WORLD_SIZE_ENV] = str(role.replicas)
    else:
        identity.update(ELASTIC_AGENT_ENV)
    containers = spec.get("containers") or []
    for i, container in enumerate(containers):
        env_vars = [e for e in container.get("env") or [] if e.get("name") not in identity]
        container["env"] = env_vars + [{"name": k, "value": v} for k, v in identity.items()]
        if i == 0 and role.elastic is not None:
            training = list(role.elastic.command) or [
                *(container.get("command") or []),
                *(container.get("args") or []),
            ]
            host = rendezvous_host or rendezvous_service(job)
            container["command"] = elastic_command(job, role, pod, host, training)
            container.pop("args", None)
        if i == 0:
            quantities = pod.resources.to_quantities()
            if quantities:
                container["resources"] = {"requests": quantities, "limits": dict(quantities)}
    spec["restartPolicy"] = "Never"
    owner = obj.get("apiVersion") or f"{GROUP}/{VERSION}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(job.name, pod.role, pod.index),
            "namespace": job.namespace,
            "labels": labels,
            "annotations": dict(tmeta.get("annotations") or {}),
            "ownerReferences": [
                {
                    "apiVersion": owner,
                    "kind": obj.get("kind") or KIND,
                    "name": job.name,
                    "uid": job.uid,
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": spec,
    }


TRAINING_JOB = register_adapter(TrainingJobAdapter())

__all__ = [
    "GROUP",
    "KIND",
    "PLURAL",
    "TRAINING_JOB",
    "VERSION",
    "TrainingJobAdapter",
    "elastic_command",
    "pod_manifest",
    "rendezvous_service",
]
