"""Warm spares of a TrainingJob's in-place roles on Kubernetes (pure: manifests, decisions).

A cold scale-up costs a pod's scheduling, its start, torch's import and the model's build.
A role with ``elastic.spares: N`` (mode inPlace) has N *spare pods*: the role's own pod
(its template, resources, command and wiring), whose worker builds its model and then
waits in the SDK's ``wait_admitted``. A new pod of the role takes a spare instead of a
cold start, and another spare is started.

What a spare is, and why it is not a node:

- It is labelled ``dlrover-events.io/spare=true`` with its job, job uid and role, but no
  rank nor index: ``pods.parse_pod`` reads no node from it, so it is not counted in the
  job's replicas or status, gives no node event, and is selected by no rendezvous Service.
  Its name is ``<job>-<role>-spare-<n>`` (the smallest n free: decided, not random).
- Its variables lack what only a pod knows (``POD_ONLY``: its rank, whether it hosts the
  job's store, how many members the first generation waits for), and name its admission
  file (DLROVER_EVENTS_ELASTIC_ADMIT): a downward-API volume file of the pod's annotation
  ``dlrover-events.io/spare-admission``. The kubelet writes it empty while the annotation
  is unset (``wait_admitted`` waits on an empty file) and rewrites it, atomically, when
  the annotation changes: the change of the pod triggers its sync.
- ``ANN_SPARE_KEY``: a digest of the pod it was made as, less what only a pod knows. A new
  pod takes a spare only when its own manifest has the same digest: the same template,
  resources, command and wiring; a plan that gave the node other resources, or a changed
  role, gets a cold start (and spares of the old form are replaced).

Admission is one merge patch of the spare, on the version it was read at (a spare being
deleted or admitted meanwhile refuses it: Conflict, and the next spare or a cold start is
tried): the new node's rank and index labels, the spare label removed, and the annotation
set to ``{"pod": <its name>, "env": <the pod's variables>}``. From then on the spare *is*
that node's pod: the reconciler lists it by its labels (its name stays the spare's), a
restarted operator finds it there, and a create of that node is never repeated (the
index is taken). The worker takes the variables on and joins the group at its next
boundary, with no restart. The job's membership store would do too, but it lives in rank
0's worker (the operator would have to speak torch's store protocol to a pod) and it is
gone exactly when the job forms anew; the pod's own annotation needs nothing but the API
server and the kubelet.

What spares cost: each holds the requests of the pod it would be (CPU, memory and GPUs)
for as long as it waits, on a node the cluster's scheduler placed it on.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dlrover_events.sdk.identity import (
    ADDRESS_ENV,
    ELASTIC_ADMIT_ENV,
    ELASTIC_EXPECT_ENV,
    ELASTIC_STORE_HOST_ENV,
    PEERS_ENV_PREFIX,
    PORT_ENV,
    RANK_ENV,
)
from handlers.operator.kube.pods import (
    ANN_CONTAINER,
    ANN_PEERS,
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_JOB_UID,
    LABEL_MANAGED_BY,
    LABEL_RANK,
    LABEL_ROLE,
    MANAGED_BY,
)
from handlers.operator.platform.bodies import (
    DOMAIN,
    FINAL_PHASES,
    PENDING,
    RUNNING,
    JobView,
    NewPod,
)

#: A spare pod's label (value "true"); admission removes it.
LABEL_SPARE = f"{DOMAIN}/spare"
#: The digest of the pod a spare was made as (see the module).
ANN_SPARE_KEY = f"{DOMAIN}/spare-key"
#: The admission: the node's pod name and variables, as JSON; unset while it waits.
ANN_SPARE_ADMISSION = f"{DOMAIN}/spare-admission"
#: The downward-API volume that shows the admission annotation to the spare's containers.
ADMISSION_VOLUME = "dlrover-events-admission"
ADMISSION_DIR = "/etc/dlrover-events/admission"
ADMISSION_FILE = "admission.json"
ADMISSION_PATH = f"{ADMISSION_DIR}/{ADMISSION_FILE}"
#: Variables only a pod has: a spare learns them when it is admitted.
POD_ONLY = (RANK_ENV, ELASTIC_STORE_HOST_ENV, ELASTIC_EXPECT_ENV)
#: A pod's own address and port, and its TF_CONFIG (its task): its rank's too.
_PEER_VARIABLES = (ADDRESS_ENV, PORT_ENV, "TF_CONFIG")
#: Seconds before a role's spare is started again after one ended on its own (a spare
#: that cannot start must not be started in a loop).
SPARE_BACKOFF_S = 10.0


@dataclass(frozen=True)
class Spare:
    """A spare pod as listed."""

    name: str
    job_uid: str
    role: str
    key: str
    phase: str
    deleting: bool
    resource_version: str
    #: how it ended, when it did ("exit 1 (Error)")
    ended: str = ""

    @property
    def finished(self) -> bool:
        return self.phase in FINAL_PHASES


@dataclass(frozen=True)
class SpareActions:
    """What keeps a job's spares as its roles ask: spares to delete, how many to start
    per role, and those that ended on their own (a reason to wait before the next)."""

    delete: tuple[str, ...] = ()
    create: Mapping[str, int] = field(default_factory=dict)
    ended: tuple[Spare, ...] = ()


def selector(job: str) -> str:
    """Label selector of a job's spares (of any job of that name: a stale one's go)."""
    return f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_JOB}={job},{LABEL_SPARE}=true"


def parse_spare(obj: Mapping[str, Any]) -> Spare | None:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(LABEL_SPARE) != "true" or LABEL_ROLE not in labels:
        return None
    status = obj.get("status") or {}
    ended = ""
    for c in status.get("containerStatuses") or []:
        done = (c.get("state") or {}).get("terminated")
        if done:
            ended = f"exit {done.get('exitCode')} ({done.get('reason') or 'no reason'})"
            break
    return Spare(
        name=str(meta.get("name", "")),
        job_uid=str(labels.get(LABEL_JOB_UID, "")),
        role=str(labels[LABEL_ROLE]),
        key=str((meta.get("annotations") or {}).get(ANN_SPARE_KEY, "")),
        phase=str(status.get("phase") or PENDING),
        deleting=meta.get("deletionTimestamp") is not None,
        resource_version=str(meta.get("resourceVersion") or ""),
        ended=ended,
    )


def in_place_roles(job: JobView) -> tuple[str, ...]:
    """The roles that may have spares (in place), whether they ask for any now or not."""
    return tuple(
        n for n, r in sorted(job.roles.items()) if r.elastic is not None and r.elastic.in_place
    )


def wanted(job: JobView, *, ended: bool) -> dict[str, int]:
    """role -> spares to keep: none for a job that ended or is suspended, nor for a role
    scaled to nothing."""
    if ended or job.suspended:
        return {}
    out = {}
    for name in in_place_roles(job):
        role = job.roles[name]
        assert role.elastic is not None
        if role.elastic.spares > 0 and role.replicas > 0:
            out[name] = role.elastic.spares
    return out


def prototype(job: JobView, role: str) -> NewPod:
    """The node a spare is made as: the role's next rank with the role's resources (rank
    and index are a pod's own and stripped; a node a plan gave resources of its own gets
    another digest, and a cold start)."""
    return NewPod(role, job.roles[role].replicas, 0, job.roles[role].resources)


def _bare(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The pod less what only a pod has: its name, rank and index, its POD_ONLY variables."""
    out = copy.deepcopy(dict(manifest))
    meta = out.setdefault("metadata", {})
    meta.pop("name", None)
    labels = meta.setdefault("labels", {})
    for label in (LABEL_RANK, LABEL_INDEX):
        labels.pop(label, None)
    spec = out.get("spec") or {}
    spec.pop("hostname", None)  # a rank's; an admitted spare keeps its own
    (meta.get("annotations") or {}).pop(ANN_PEERS, None)  # the job's size, kept by the operator
    for container in spec.get("containers") or []:
        env = [e for e in container.get("env") or [] if not _pod_only(str(e.get("name")))]
        container["env"] = env
    return out


def _pod_only(name: str) -> bool:
    """A variable only a pod has (its rank's), or one of the job's size (its peers)."""
    return name in POD_ONLY or name in _PEER_VARIABLES or name.startswith(PEERS_ENV_PREFIX)


def spare_key(manifest: Mapping[str, Any]) -> str:
    """The digest a spare and the pod that takes it share (see the module)."""
    text = json.dumps(_bare(manifest), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def spare_manifest(manifest: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A spare made from the manifest of a pod of its role (see the module)."""
    out = _bare(manifest)
    meta = out["metadata"]
    meta["name"] = name
    meta["labels"][LABEL_SPARE] = "true"
    meta["annotations"] = {**(meta.get("annotations") or {}), ANN_SPARE_KEY: spare_key(manifest)}
    spec = out.setdefault("spec", {})
    for container in spec.get("containers") or []:
        container["env"] = [*container["env"], {"name": ELASTIC_ADMIT_ENV, "value": ADMISSION_PATH}]
        container["volumeMounts"] = [
            *(container.get("volumeMounts") or []),
            {"name": ADMISSION_VOLUME, "mountPath": ADMISSION_DIR, "readOnly": True},
        ]
    spec["volumes"] = [
        *(spec.get("volumes") or []),
        {
            "name": ADMISSION_VOLUME,
            "downwardAPI": {
                "items": [
                    {
                        "path": ADMISSION_FILE,
                        "fieldRef": {"fieldPath": f"metadata.annotations['{ANN_SPARE_ADMISSION}']"},
                    }
                ]
            },
        },
    ]
    return out


def spare_name(job: str, role: str, taken: Iterable[str]) -> str:
    """``<job>-<role>-spare-<n>``, the smallest n no pod of the job has."""
    used = set(taken)
    n = 0
    while f"{job}-{role}-spare-{n}" in used:
        n += 1
    return f"{job}-{role}-spare-{n}"


def _training_container(manifest: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = (manifest.get("spec") or {}).get("containers") or [{}]
    named = ((manifest.get("metadata") or {}).get("annotations") or {}).get(ANN_CONTAINER)
    return next((c for c in containers if named and c.get("name") == named), containers[0])


def admission(spare: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What an admitted spare's worker takes on: the node's variables (those of its
    training container that are plain values; a Secret's are the spare's already)."""
    env = {
        e["name"]: e["value"]
        for e in _training_container(manifest).get("env") or []
        if "value" in e
    }
    return {"pod": spare, "env": env}


def admission_patch(spare: Spare, pod: NewPod, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that makes ``spare`` the pod of ``pod``'s node, on the version it was
    read at (a precondition: Conflict when it changed since)."""
    return {
        "metadata": {
            "resourceVersion": spare.resource_version,
            "labels": {LABEL_RANK: str(pod.rank), LABEL_INDEX: str(pod.index), LABEL_SPARE: None},
            "annotations": {
                ANN_SPARE_ADMISSION: json.dumps(admission(spare.name, manifest), sort_keys=True),
                ANN_SPARE_KEY: None,
            },
        }
    }


def candidates(spares: Iterable[Spare], job: JobView, role: str, key: str) -> list[Spare]:
    """The spares a new pod of ``role`` with digest ``key`` may take, warmest first: running
    (its worker waits with its model built), then pending; by name."""
    order = {RUNNING: 0, PENDING: 1}
    fit = [
        s
        for s in spares
        if s.job_uid == job.uid
        and s.role == role
        and s.key == key
        and not s.deleting
        and s.phase in order
    ]
    return sorted(fit, key=lambda s: (order[s.phase], s.name))


def keep(
    job: JobView, spares: Sequence[Spare], want: Mapping[str, int], keys: Mapping[str, str]
) -> SpareActions:
    """Spares to delete and to start so that each role of ``job`` has ``want`` of them,
    each made as the role's pod is now (``keys``): one of another job of that name, of a
    role that wants none (or fewer), of an older form, or one that ended goes; running
    ones are kept before pending ones."""
    delete: list[str] = []
    ended: list[Spare] = []
    kept: dict[str, int] = {}
    order = {RUNNING: 0, PENDING: 1}
    for spare in sorted(spares, key=lambda s: (order.get(s.phase, 2), s.name)):
        if spare.deleting:
            continue
        if spare.finished:
            if spare.job_uid == job.uid:
                ended.append(spare)
            delete.append(spare.name)
            continue
        fits = spare.job_uid == job.uid and keys.get(spare.role) == spare.key
        if not fits or kept.get(spare.role, 0) >= want.get(spare.role, 0):
            delete.append(spare.name)
            continue
        kept[spare.role] = kept.get(spare.role, 0) + 1
    create = {role: n - kept.get(role, 0) for role, n in want.items() if n > kept.get(role, 0)}
    return SpareActions(tuple(delete), create, tuple(ended))


__all__ = [
    "ADMISSION_DIR",
    "ADMISSION_FILE",
    "ADMISSION_PATH",
    "ADMISSION_VOLUME",
    "ANN_SPARE_ADMISSION",
    "ANN_SPARE_KEY",
    "LABEL_SPARE",
    "POD_ONLY",
    "SPARE_BACKOFF_S",
    "Spare",
    "SpareActions",
    "admission",
    "admission_patch",
    "candidates",
    "in_place_roles",
    "keep",
    "parse_spare",
    "prototype",
    "selector",
    "spare_key",
    "spare_manifest",
    "spare_name",
    "wanted",
]
