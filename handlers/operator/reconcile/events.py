"""What a pod's state means for the brain: node and job events, with ids derived from the
pod (uid + state) so that a re-list, a second watch or a restarted operator says the same
thing under the same id, which consumers already treat as one event. The same on every
platform: the brain cannot tell them apart.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from handlers.operator.platform.bodies import (
    FAILED,
    IDENTITY_LABELS,
    RUNNING,
    SUCCEEDED,
    JobView,
    PodView,
    RoleView,
)
from schemas.jobs import (
    JobCompleted,
    JobEvent,
    JobFailed,
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeExited,
    NodeFailed,
    NodeOOM,
    NodeRef,
    NodeStarted,
    OOMKind,
    RoleSpec,
)

SOURCE = "kube-operator"
APP_LABEL = IDENTITY_LABELS["app"]

_EVENT_NAMESPACE = uuid.UUID("4f1c8a2e-93b7-4d05-8e6a-1b2c3d4e5f60")


def event_id(env: str, uid: str, what: str) -> uuid.UUID:
    """The same fact about the same object in the same env: the same id."""
    return uuid.uuid5(_EVENT_NAMESPACE, f"{env}/{uid}/{what}")


def job_meta(job: JobView) -> JobMeta:
    """The job as the brain knows it: uuid is the TrainingJob's uid, so a job deleted and
    created again under the same name is a new job, and plans for the old one miss. Its
    user, group, cluster, scenario and app (the job's ``dlrover-events.io/<name>``
    labels) are what config documents target and what history is kept by, so every
    event of the job carries them."""
    return JobMeta(
        uuid=job.uid,
        name=job.name,
        namespace=job.namespace,
        labels=dict(job.labels),
        **job.identity(),
    )


def rendezvous_host(role: RoleView) -> int | None:
    """The node of an elastic role that hosts the job's rendezvous store (None: the role
    is not elastic, or its store is hosted outside the job)."""
    elastic = role.elastic
    if elastic is None or elastic.host_rank < 0:
        return None
    return elastic.host_rank


def submitted(env: str, job: JobView, at: datetime | None = None) -> JobSubmitted:
    """The job as a cluster scheduler takes it: its roles, and how it shares the cluster:
    its priority (the ``dlrover-events.io/priority`` label), whose quota it draws on (its
    group label, else its user label) and the Kueue queue that admits it (Kueue's
    ``kueue.x-k8s.io/queue-name`` label), and the batch it says it trains with
    (``spec.batch``: a scheduler may then choose its batch per allocation), and which node
    of each role hosts its rendezvous (what the brain must not migrate where the platform
    cannot replace it)."""
    who = job.identity()
    roles = {
        name: RoleSpec(
            replicas=role.replicas,
            min_replicas=role.min_replicas,
            max_replicas=role.max_replicas,
            cpu=(role.resources.cpu_milli or 0) / 1000,
            memory=role.resources.memory or 0,
            gpu_num=role.resources.gpu or 0,
            rendezvous_host=rendezvous_host(role),
        )
        for name, role in job.roles.items()
    }
    distribution = "ps" if "ps" in roles else "allreduce" if "worker" in roles else "custom"
    extra: dict[str, Any] = {} if at is None else {"occurred_at": at}
    if job.batch is not None:
        batch = job.batch
        extra |= {
            "batch_size": batch.size,
            "min_batch_size": batch.min_size,
            "max_batch_size": batch.max_size,
            "min_local_batch_size": batch.min_local,
            "max_local_batch_size": batch.max_local,
            "adaptive_batch_size": batch.adaptive,
        }
    return JobSubmitted(
        env=env,
        event_id=event_id(env, job.uid, "submitted"),
        source=SOURCE,
        job=job_meta(job),
        roles=roles,
        application=job.labels.get(APP_LABEL, ""),
        distribution=distribution,
        priority=job.priority,
        group=who.get("group") or who.get("user"),
        kueue_queue=job.kueue_queue,
        **extra,
    )


def node_events(env: str, meta: JobMeta, pod: PodView) -> list[JobEvent]:
    """The event the pod's current state is (none while it is pending or deleted)."""
    if pod.deleting:
        return []
    node = NodeRef(type=pod.role, id=pod.rank, name=pod.name)
    base: dict[str, Any] = {"env": env, "source": SOURCE, "job": meta, "node": node}
    t = pod.termination
    if t is not None and t.oom and pod.phase != SUCCEEDED:
        return [
            NodeOOM(
                **base,
                event_id=event_id(env, pod.uid, "oom"),
                kind=OOMKind.HOST_MEMORY,
                exit_code=137,
                memory=pod.resources.memory,
            )
        ]
    if pod.phase == FAILED:
        return [
            NodeFailed(
                **base,
                event_id=event_id(env, pod.uid, "failed"),
                reason=t.reason if t is not None else "Failed",
                exit_code=t.exit_code if t is not None else None,
            )
        ]
    if pod.phase == SUCCEEDED:
        return [
            NodeExited(
                **base,
                event_id=event_id(env, pod.uid, "exited"),
                exit_code=t.exit_code if t is not None else 0,
            )
        ]
    if pod.phase == RUNNING:
        return [NodeStarted(**base, event_id=event_id(env, pod.uid, "started"))]
    return []


def job_events(
    env: str, job: JobView, pods: Sequence[PodView], ended: tuple[str | None, str]
) -> list[JobEvent]:
    """Started once a pod of the job runs; Completed or Failed once it ended."""
    meta = job_meta(job)
    base: Mapping[str, Any] = {"env": env, "source": SOURCE, "job": meta}
    out: list[JobEvent] = []
    if any(p.running and p.job_uid == job.uid for p in pods):
        out.append(JobStarted(**base, event_id=event_id(env, job.uid, "started")))
    what, reason = ended
    if what == SUCCEEDED:
        out.append(JobCompleted(**base, event_id=event_id(env, job.uid, "completed")))
    elif what == FAILED:
        out.append(JobFailed(**base, event_id=event_id(env, job.uid, "failed"), reason=reason))
    return out


__all__ = [
    "SOURCE",
    "event_id",
    "job_events",
    "job_meta",
    "node_events",
    "rendezvous_host",
    "submitted",
]
