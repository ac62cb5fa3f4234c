"""A Kubernetes Pod of a job, as the port's ``PodView``: how this operator labels the pods
it makes, and how a pod's JSON (as a list or a watch delivers it) reads.

Pods are named ``<job>-<role>-<index>`` and labelled with their job, role and rank. The
rank is the node's id towards the brain (NodeRef.id) and stays with the node when it is
migrated; the index only makes names unique, so a migrated node's new pod (created before
the old one goes) gets a new index and keeps the rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from handlers.operator.document.quantity import QuantityError, resources_from_container
from handlers.operator.platform.bodies import DOMAIN, PENDING, PodView, Resources, Termination

LABEL_JOB = f"{DOMAIN}/job"
LABEL_JOB_UID = f"{DOMAIN}/job-uid"
LABEL_ROLE = f"{DOMAIN}/role"
LABEL_RANK = f"{DOMAIN}/rank"
LABEL_INDEX = f"{DOMAIN}/index"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "dlrover-events-operator"

#: On a pod: the container that has the node's resources and runs the training command
#: (the role's ``container``; absent: the first), and the GPU type its node selector asks.
ANN_CONTAINER = f"{DOMAIN}/container"
ANN_GPU_TYPE = f"{DOMAIN}/gpu-type"
#: On a pod: its job's peers document (reconcile.peers.peers_document), which a
#: downward-API volume shows its containers as a file; kept current as the job is scaled.
ANN_PEERS = f"{DOMAIN}/peers"


def _termination(status: Mapping[str, Any]) -> Termination | None:
    """The first container that ended, an OOM kill before any other ending."""
    found: list[Termination] = []
    for c in status.get("containerStatuses") or []:
        for state in (c.get("state") or {}, c.get("lastState") or {}):
            ended = state.get("terminated")
            if ended:
                found.append(
                    Termination(
                        c.get("name", ""), int(ended.get("exitCode", 0)), ended.get("reason") or ""
                    )
                )
    if not found:
        return None
    return next((t for t in found if t.oom), found[0])


def parse_pod(obj: Mapping[str, Any]) -> PodView | None:
    """One of our pods from the API (a dict); None for a pod that is not one of a job's."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    try:
        role, rank, index = labels[LABEL_ROLE], int(labels[LABEL_RANK]), int(labels[LABEL_INDEX])
        job = labels[LABEL_JOB]
    except (KeyError, ValueError):
        return None
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    annotations = meta.get("annotations") or {}
    containers = spec.get("containers") or [{}]
    named = annotations.get(ANN_CONTAINER)
    container = next((c for c in containers if named and c.get("name") == named), containers[0])
    try:
        resources = resources_from_container(container)
    except QuantityError:
        resources = Resources()
    if annotations.get(ANN_GPU_TYPE):
        resources = replace(resources, gpu_type=annotations[ANN_GPU_TYPE])
    return PodView(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        job=job,
        job_uid=labels.get(LABEL_JOB_UID, ""),
        role=role,
        rank=rank,
        index=index,
        phase=status.get("phase") or PENDING,
        deleting=meta.get("deletionTimestamp") is not None,
        resources=resources,
        termination=_termination(status),
        node_name=spec.get("nodeName"),
        resource_version=str(meta.get("resourceVersion") or ""),
        ready=any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
            if isinstance(c, Mapping)
        ),
    )


__all__ = [
    "ANN_CONTAINER",
    "ANN_GPU_TYPE",
    "ANN_PEERS",
    "LABEL_INDEX",
    "LABEL_JOB",
    "LABEL_JOB_UID",
    "LABEL_MANAGED_BY",
    "LABEL_RANK",
    "LABEL_ROLE",
    "MANAGED_BY",
    "parse_pod",
]
