"""What the `job` commands and the operator's HTTP API decide, pure: a submission checked
before it reaches a platform (handlers.operator.document.submission, which the reconciler
shares for a JobRequest), a job as a row, a scale request as a ScalePlan.

One copy for both doors, so a job submitted from a terminal and one POSTed by a notebook
are refused for the same reasons, in the same words, and a scale is the same plan (its
id derived from the request and the job's generation: repeated, it is applied once).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from handlers.operator.document.submission import JobRequestError, submission
from handlers.operator.platform.api import JobEntry
from handlers.operator.platform.bodies import PENDING, JobView, UnreadableJob
from handlers.operator.reconcile.events import job_meta
from handlers.operator.reconcile.planning import COMPLETION_ROLES, effective_admission
from schemas.plans import NodeGroupResource, ScalePlan

_PLAN_NAMESPACE = uuid.UUID("7a2d9e4b-1c3f-4b6a-8d0e-5f7a9c1b3d2e")


def admission(job: JobView) -> dict[str, str] | None:
    """Whether the job is queued, admitted or suspended, and why (None: it runs as
    submitted, no one ever suspended it)."""
    state = effective_admission(job)
    if state is None:
        return None
    return {"state": state.state, "reason": state.reason, "message": state.message}


def summary(job: JobEntry) -> dict[str, Any]:
    """A job as a row: name, uid, phase, pods running / wanted per role, last plan,
    admission (a job that does not read: phase Invalid, and why)."""
    if isinstance(job, UnreadableJob):
        return {
            "name": job.name,
            "uid": job.uid,
            "phase": "Invalid",
            "roles": {},
            "last_plan": None,
            "reason": job.reason,
        }
    seen = job.status.roles if job.status is not None else {}
    return {
        "name": job.name,
        "uid": job.uid,
        "phase": job.phase or PENDING,
        "roles": {
            name: {"replicas": role.replicas, "running": (seen.get(name) or {}).get("running", 0)}
            for name, role in sorted(job.roles.items())
        },
        "last_plan": job.last_plan_id,
        "admission": admission(job),
    }


def scale_request(body: Any) -> tuple[str, int]:
    """``(role, replicas)`` of a scale request's JSON body (the jobs API, the console)."""
    if not isinstance(body, Mapping):
        raise JobRequestError('the body must be {"role": "worker", "replicas": N}')
    replicas, role = body.get("replicas"), body.get("role", "worker")
    if not isinstance(replicas, int) or isinstance(replicas, bool):
        raise JobRequestError('the body must be {"role": "worker", "replicas": N}')
    if not isinstance(role, str):
        raise JobRequestError("role must be a string")
    return role, replicas


class ScaleForbidden(JobRequestError):
    """A job's own token asked for what its job does not let any of its roles do."""


def scale_request_by(body: Any) -> str:
    """Who in the job asks (``by``: a pod, e.g. ``coordinator-0``), as its plan's author
    says it; empty when the body does not say."""
    by = body.get("by", "") if isinstance(body, Mapping) else ""
    if not isinstance(by, str) or len(by) > 80 or not all(c.isalnum() or c in "-_." for c in by):
        raise JobRequestError("by must be a pod's name: at most 80 letters, digits, '-_.'")
    return by


def check_job_scale(job: JobView, role: str, replicas: int) -> None:
    """What a job may ask of itself with its own token: a role that one of its roles
    ``scales``, to a count within that role's declared bounds. ScaleForbidden (no role
    may scale it) or JobRequestError (beyond the bounds) says why not."""
    if role not in job.roles:
        raise JobRequestError(
            f"trainingjob {job.name} has no role {role!r} (roles: {', '.join(job.roles)})"
        )
    scalers = sorted(r.name for r in job.roles.values() if role in r.scales)
    if not scalers:
        raise ScaleForbidden(
            f"no role of trainingjob {job.name} may scale {role} (a role's `scales` says "
            "which roles it may scale)"
        )
    target = job.roles[role]
    low = max(target.min_replicas or 0, 1)
    high = target.max_replicas if target.max_replicas is not None else target.replicas
    if not low <= replicas <= high:
        raise JobRequestError(
            f"{role} {replicas} is beyond trainingjob {job.name}'s bounds for it: "
            f"{low}..{high} (minReplicas..maxReplicas)"
        )


def scale_plan_id(uid: str, generation: int, role: str, replicas: int) -> str:
    """The same request on the same version of the job: the same plan."""
    return "cli-" + str(uuid.uuid5(_PLAN_NAMESPACE, f"{uid}/{generation}/{role}/{replicas}"))


def scale_plan(env: str, job: JobView, role: str, replicas: int, source: str) -> ScalePlan:
    if role not in job.roles:
        raise JobRequestError(
            f"trainingjob {job.name} has no role {role!r} (roles: {', '.join(job.roles)})"
        )
    if replicas < 1:
        raise JobRequestError("replicas must be at least 1: a plan cannot say 0")
    return ScalePlan(
        env=env,
        source=source,
        job=job_meta(job),
        plan_id=scale_plan_id(job.uid, job.generation, role, replicas),
        node_group_resources={role: NodeGroupResource(count=replicas)},
    )


def _action_plan_id(job: JobView, action: str) -> str:
    """The same action on the same version of the job: the same plan."""
    return f"cli-{action}-" + str(
        uuid.uuid5(_PLAN_NAMESPACE, f"{job.uid}/{job.generation}/{action}")
    )


def _kueue_refusal(job: JobView, action: str) -> None:
    if job.kueue_queue:
        raise JobRequestError(
            f"trainingjob {job.name} is managed by Kueue (queue {job.kueue_queue}): Kueue "
            f"admits and suspends it; {action} it through Kueue"
        )


def suspend_plan(env: str, job: JobView, source: str) -> ScalePlan:
    """The plan that suspends the job: its pods stop (each saving its checkpoint in its
    grace period), its place is kept, and a resume starts them again."""
    _kueue_refusal(job, "suspend")
    if job.suspended:
        raise JobRequestError(f"trainingjob {job.name} is suspended already")
    return ScalePlan(
        env=env,
        source=source,
        job=job_meta(job),
        plan_id=_action_plan_id(job, "suspend"),
        suspend=True,
    )


def resume_plan(env: str, job: JobView, source: str) -> ScalePlan:
    """The plan that resumes (or admits) a suspended job at the size it had: a count for
    its first training role (worker, chief, master, else its first role with replicas)."""
    _kueue_refusal(job, "resume")
    if not job.suspended:
        raise JobRequestError(f"trainingjob {job.name} is not suspended")
    sized = [r for r in job.roles.values() if r.replicas > 0]
    if not sized:
        raise JobRequestError(f"trainingjob {job.name} has no replicas to resume")
    role = next((r for r in sized if r.name in COMPLETION_ROLES), sized[0])
    return ScalePlan(
        env=env,
        source=source,
        job=job_meta(job),
        plan_id=_action_plan_id(job, "resume"),
        node_group_resources={role.name: NodeGroupResource(count=role.replicas)},
    )


__all__ = [
    "JobRequestError",
    "ScaleForbidden",
    "admission",
    "check_job_scale",
    "resume_plan",
    "scale_plan",
    "scale_plan_id",
    "scale_request",
    "scale_request_by",
    "submission",
    "summary",
    "suspend_plan",
]
