"""The TrainingJob on Kubernetes: this operator creates the pods.

The job document itself (parsed, patched) is ``handlers.operator.document.trainingjob``'s, the
same on every platform; this is what a cluster adds. A pod is the role's template with
what the operator owns put on top: its name and labels (job, job uid, role, rank, index),
requests = limits = the node's resources on the role's container (``container``, else
the first), its GPU type as a node selector on the operator's GPU type label, what the
node runs (``reconcile.launch``: the training command, the SDK's identity variables),
restartPolicy Never (a pod that ends is replaced by the operator, by the role's
restartPolicy, under a new index) and an owner reference, so that on a cluster with a
garbage collector deleting the job deletes its pods.

An elastic role also gets a headless Service that resolves to its rendezvous host pod
(rank 0), owned by the job like its pods.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dlrover_events.sdk.identity import READY_FILE_ENV, VOLUME_ENV_PREFIX, env_suffix
from handlers.operator.document import trainingjob
from handlers.operator.document.quantity import resources_to_quantities
from handlers.operator.kube.adapter import PodCreatingAdapter
from handlers.operator.kube.pods import (
    ANN_CONTAINER,
    ANN_GPU_TYPE,
    ANN_PEERS,
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_JOB_UID,
    LABEL_MANAGED_BY,
    LABEL_RANK,
    LABEL_ROLE,
    MANAGED_BY,
    parse_pod,
)
from handlers.operator.kube.wiring import PodWiring
from handlers.operator.platform.bodies import (
    JobSpecChange,
    JobView,
    NewPod,
    OperatorJobStatus,
    PlanChange,
    PlatformCapabilities,
    PodView,
    RoleView,
)
from handlers.operator.reconcile import peers, planning
from handlers.operator.reconcile.launch import C10D, launch
from schemas.plans import NotApplied, ScalePlan

#: The node label a cluster names its nodes' GPU types with (NVIDIA's GPU feature
#: discovery); the Kubernetes operator's default (DLROVER_EVENTS_OPERATOR_GPU_TYPE_LABEL).
DEFAULT_GPU_TYPE_LABEL = "nvidia.com/gpu.product"


class TrainingJobAdapter(PodCreatingAdapter):
    """``gpu_type_label``: the node label GPU types are selected by; None leaves a plan's
    GPU type not applied. ``rendezvous_backend``: what an elastic pod's torchrun agent
    rendezvous with (``launch.C10D``, or ``DLROVER_C10D`` where the images have the SDK)."""

    kind = trainingjob.KIND
    group = trainingjob.GROUP
    version = trainingjob.VERSION
    plural = trainingjob.PLURAL

    def __init__(
        self,
        gpu_type_label: str | None = None,
        wiring: PodWiring | None = None,
        rendezvous_backend: str = C10D,
    ) -> None:
        self.gpu_type_label = gpu_type_label or None
        self.wiring = wiring
        self.rendezvous_backend = rendezvous_backend

    def configured(
        self,
        *,
        gpu_type_label: str | None,
        wiring: PodWiring | None = None,
        rendezvous_backend: str = C10D,
    ) -> TrainingJobAdapter:
        return TrainingJobAdapter(gpu_type_label, wiring, rendezvous_backend)

    @property
    def capabilities(self) -> PlatformCapabilities:
        """GPU types where nodes name theirs (``gpu_type_label``), warm spares, suspend
        (``spec.suspend``), any node migrated but an elastic role's rendezvous host (its
        headless Service points at that pod, whose agent holds the c10d store)."""
        return PlatformCapabilities(
            gpu_types=self.gpu_type_label is not None,
            spares=True,
            suspend=True,
            migrates_nodes=True,
            replaces_rendezvous_host=False,
        )

    def plan_not_applied(self, plan: ScalePlan) -> tuple[NotApplied, ...]:
        return trainingjob.plan_not_applied(plan, gpu_types=self.capabilities.gpu_types)

    def services(self, job: JobView, *, rendezvous_host: str | None = None) -> list[dict[str, Any]]:
        return [] if rendezvous_host else [*rendezvous_services(job), *role_services(job)]

    def pod_annotations(self, job: JobView) -> dict[str, str]:
        """The job's peers document, current with its replicas: the downward-API file
        its pods read (``cluster_info``) follows a scale."""
        return {ANN_PEERS: peers_annotation(job)}

    def parse(self, obj: Mapping[str, Any]) -> JobView:
        return trainingjob.parse_job(obj)

    def parse_pod(self, obj: Mapping[str, Any]) -> PodView | None:
        return parse_pod(obj)

    def pod_selector(self) -> str:
        return f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_JOB}"

    def plan_change(self, job: JobView, pods: Sequence[PodView], plan: ScalePlan) -> PlanChange:
        return planning.plan_change(job, pods, plan, self.capabilities)

    def job_patch(self, job: JobView, change: JobSpecChange) -> dict[str, Any]:
        return trainingjob.job_patch(job, change)

    def status_patch(self, status: OperatorJobStatus) -> dict[str, Any] | None:
        return trainingjob.status_patch(status)

    def pod_manifest(
        self, job: JobView, pod: NewPod, env: str, *, rendezvous_host: str | None = None
    ) -> dict[str, Any]:
        return pod_manifest(
            job,
            pod,
            env,
            rendezvous_host=rendezvous_host,
            gpu_type_label=self.gpu_type_label,
            wiring=self.wiring,
            rendezvous_backend=self.rendezvous_backend,
        )


_SERVICE_SUFFIX = "-rdzv"


def rendezvous_service(job: JobView, role: str) -> str:
    """The headless Service an elastic role's pods rendezvous at, on a cluster:
    ``<job>-<role>-rdzv`` (``peers.service_name``: cut short with a digest where that is
    no DNS-1035 label of at most 63 characters)."""
    return peers.service_name(job.name, role, _SERVICE_SUFFIX)


PEERS_VOLUME = "dlrover-events-peers"
PEERS_DIR = "/etc/dlrover-events/peers"
PEERS_FILE = f"{PEERS_DIR}/peers.json"
#: Where a pod's SDK says it is ready (``ready()``), and the readiness probe that reads it
#: on a role another starts after, when its template has no probe of its own.
READY_PATH = "/tmp/dlrover-events-ready"


def addressing() -> peers.Addressing:
    """Every pod its own host, under its role's headless Service (``role_services``)."""
    return peers.Addressing("dns", PEERS_FILE)


def peers_annotation(job: JobView) -> str:
    return json.dumps(peers.peers_document(job, addressing()), sort_keys=True)


def role_services(job: JobView) -> list[dict[str, Any]]:
    """One headless Service per role, ``<job>-<role>``, selecting the role's pods of this
    job: the subdomain of each pod's hostname (``<role>-<rank>``), so that every pod has a
    DNS name its rank keeps when the pod is replaced (peers.address).
    ``publishNotReadyAddresses``: a peer is found as soon as it has an address."""
    out = []
    for name, role in sorted(job.roles.items()):
        port = role.port or peers.DEFAULT_PORT
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": peers.service_name(job.name, name),
                    "namespace": job.namespace,
                    "labels": {
                        LABEL_MANAGED_BY: MANAGED_BY,
                        LABEL_JOB: job.name,
                        LABEL_JOB_UID: job.uid,
                        LABEL_ROLE: name,
                    },
                    "ownerReferences": [_owner(job)],
                },
                "spec": {
                    "clusterIP": "None",
                    "selector": {
                        LABEL_MANAGED_BY: MANAGED_BY,
                        LABEL_JOB_UID: job.uid,
                        LABEL_ROLE: name,
                    },
                    "publishNotReadyAddresses": True,
                    "ports": [
                        {"name": "peer", "port": port, "targetPort": port, "protocol": "TCP"}
                    ],
                },
            }
        )
    return out


def _owner(job: JobView) -> dict[str, Any]:
    """The job as owner: a cluster's garbage collector deletes what it owns with it."""
    return {
        "apiVersion": trainingjob.API_VERSION,
        "kind": trainingjob.KIND,
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


def rendezvous_services(job: JobView) -> list[dict[str, Any]]:
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
                    "ownerReferences": [_owner(job)],
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


@dataclass(frozen=True)
class ServiceChanges:
    create: tuple[dict[str, Any], ...] = ()
    delete: tuple[str, ...] = ()


def _service_key(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes a Service the one wanted: its owner, selector and ports."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    owners = tuple(o.get("uid") for o in meta.get("ownerReferences") or [])
    ports = tuple((p.get("name"), p.get("port")) for p in spec.get("ports") or [])
    return owners, tuple(sorted((spec.get("selector") or {}).items())), ports


def service_changes(
    wanted: Sequence[Mapping[str, Any]], existing: Sequence[Mapping[str, Any]]
) -> ServiceChanges:
    """Services to delete and create so that a job's are the ``wanted`` ones: one of an
    earlier job of the same name (another owner), or that selects or serves otherwise,
    is deleted and made again (a selector is not patched under pods that resolve it)."""
    by_name = {(s.get("metadata") or {}).get("name"): s for s in existing}
    names = {s["metadata"]["name"] for s in wanted}
    delete = [n for n, s in by_name.items() if n not in names]
    create = []
    for svc in wanted:
        have = by_name.get(svc["metadata"]["name"])
        if have is not None and _service_key(have) == _service_key(svc):
            continue
        if have is not None:
            delete.append(svc["metadata"]["name"])
        create.append(dict(svc))
    return ServiceChanges(tuple(create), tuple(sorted(n for n in delete if n)))


def _mount_volumes(job: JobView, role: RoleView, spec: dict[str, Any]) -> None:
    """The job volumes the role names, on the pod (a template's volume of the same name
    gives way to the job's), each mounted in every container; and the peers document's
    downward-API volume."""
    named = {m.name for m in role.volumes} | {PEERS_VOLUME}
    volumes = [v for v in spec.get("volumes") or [] if v.get("name") not in named]
    volumes.extend(dict(job.volumes[m.name]) for m in role.volumes)
    volumes.append(
        {
            "name": PEERS_VOLUME,
            "downwardAPI": {
                "items": [
                    {
                        "path": PEERS_FILE.rsplit("/", 1)[1],
                        "fieldRef": {"fieldPath": f"metadata.annotations['{ANN_PEERS}']"},
                    }
                ]
            },
        }
    )
    spec["volumes"] = volumes
    mounts = [
        {"name": m.name, "mountPath": m.mount_path, **({"readOnly": True} if m.read_only else {})}
        for m in role.volumes
    ]
    mounts.append({"name": PEERS_VOLUME, "mountPath": PEERS_DIR, "readOnly": True})
    for container in spec.get("containers") or []:
        kept = [
            v
            for v in container.get("volumeMounts") or []
            if v.get("name") not in named
            and v.get("mountPath") not in {m["mountPath"] for m in mounts}
        ]
        container["volumeMounts"] = kept + [dict(m) for m in mounts]


def _training_index(role: RoleView, containers: Sequence[Mapping[str, Any]]) -> int:
    """The index of the role's container (its ``container``, else the first)."""
    if role.container is not None:
        for i, c in enumerate(containers):
            if c.get("name") == role.container:
                return i
    return 0


def pod_manifest(
    job: JobView,
    pod: NewPod,
    env: str,
    *,
    rendezvous_host: str | None = None,
    gpu_type_label: str | None = None,
    wiring: PodWiring | None = None,
    rendezvous_backend: str = C10D,
) -> dict[str, Any]:
    """The pod of one node of a job (pure: the same inputs give the same pod).

    What it runs is ``launch``'s: the training command on the role's container (an
    elastic role's under torchrun), the identity variables on every container. The
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
    host = rendezvous_host or rendezvous_service(job, pod.role)
    runs = launch(job, pod, env, host, rendezvous_backend, addressing())
    variables = dict(runs.env)
    variables[READY_FILE_ENV] = READY_PATH
    for mount in role.volumes:
        variables[VOLUME_ENV_PREFIX + env_suffix(mount.name)] = mount.mount_path
    containers = spec.get("containers") or []
    chosen = _training_index(role, containers)
    annotations = dict(tmeta.get("annotations") or {})
    annotations[ANN_PEERS] = peers_annotation(job)
    spec["hostname"] = peers.hostname(pod.role, pod.rank)
    spec["subdomain"] = peers.service_name(job.name, pod.role)
    _mount_volumes(job, role, spec)
    awaited = any(pod.role in r.start_after for r in job.roles.values())
    for i, container in enumerate(containers):
        env_vars = [e for e in container.get("env") or [] if e.get("name") not in variables]
        container["env"] = env_vars + [{"name": k, "value": v} for k, v in variables.items()]
        if i != chosen:
            continue
        if awaited and "readinessProbe" not in container:
            container["readinessProbe"] = {
                "exec": {"command": ["cat", READY_PATH]},
                "periodSeconds": 2,
            }
        if runs.command is not None:
            container["command"] = list(runs.command)
            container.pop("args", None)
        quantities = resources_to_quantities(pod.resources)
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
            "name": pod.name(job.name),
            "namespace": job.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [_owner(job)],
        },
        "spec": spec,
    }


TRAINING_JOB = TrainingJobAdapter()

__all__ = [
    "ANN_PEERS",
    "DEFAULT_GPU_TYPE_LABEL",
    "PEERS_FILE",
    "PEERS_VOLUME",
    "READY_PATH",
    "TRAINING_JOB",
    "ServiceChanges",
    "TrainingJobAdapter",
    "addressing",
    "host_selector",
    "peers_annotation",
    "pod_manifest",
    "rendezvous_service",
    "rendezvous_services",
    "role_services",
    "service_changes",
]
