"""A JobSpecChange and an OperatorJobStatus applied to a typed job: what a platform that
keeps its jobs as values (the local platform) writes, with no job document in between.

Kubernetes keeps a job as a TrainingJob document, so there a change goes through a merge
patch and the job is read back (handlers.operator.document.trainingjob). The functions here
give the same ``JobView`` that patch-and-read gives, field for field, and a property test
holds the two paths to it (tests/property/test_job_changes.py), so the platforms cannot
drift apart: what a merge patch merges (a role's resources, a role's pod counts, a status
field left unsaid) is merged here too, and what a read normalises (an empty GPU type or
plan id: none) is normalised here too.

The plan ids land in the same value as the change they record, so a store that writes the
returned job in one write keeps the reconciler's plan-once rule: a plan delivered again
after a crash finds its change made. The job's version and generation are the store's to
move (``spec_changed`` says when its generation does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from handlers.operator.platform.bodies import (
    JobAdmission,
    JobSpecChange,
    JobView,
    OperatorJobStatus,
    Resources,
)


def _as_read(resources: Resources) -> Resources:
    """Resources as a job's read gives them back: an empty GPU type is none."""
    if resources.gpu_type == "":
        return replace(resources, gpu_type=None)
    return resources


def _admission_as_read(admission: JobAdmission) -> JobAdmission:
    """An admission as a job's read gives it back: an empty plan id is none."""
    return replace(admission, plan_id=admission.plan_id or None)


def apply_change(job: JobView, change: JobSpecChange) -> JobView:
    """``job`` with ``change`` made: replicas and resources of the roles it has (a
    resource the change leaves unset keeps the role's), the per-node resources, the ranks
    removed first and the plan ids as the change lists them, suspend and admission where
    it says them. Its version and generation are the job's: the store moves them when it
    writes the result, on the version the change names."""
    roles = {}
    for name, role in job.roles.items():
        resources = role.resources
        if name in change.resources:
            resources = _as_read(change.resources[name].over(role.resources))
        roles[name] = replace(
            role, replicas=int(change.replicas.get(name, role.replicas)), resources=resources
        )
    return replace(
        job,
        roles=roles,
        node_resources={
            role: {int(rank): _as_read(res) for rank, res in ranks.items()}
            for role, ranks in change.node_resources.items()
            if ranks
        },
        remove_first={
            role: tuple(int(rank) for rank in ranks) for role, ranks in change.remove_first.items()
        },
        applied_plans=tuple(change.applied_plans),
        suspended=job.suspended if change.suspend is None else change.suspend,
        admission=(
            job.admission if change.admission is None else _admission_as_read(change.admission)
        ),
    )


def _counts(
    before: Mapping[str, Mapping[str, int]], said: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, int]]:
    """Pod counts per role: the said roles' counts over what was said before (a role
    left unsaid keeps its counts, as a status merge patch keeps them)."""
    out = {role: dict(counts) for role, counts in before.items()}
    for role, counts in said.items():
        out[role] = {**out.get(role, {}), **counts}
    return out


def apply_status(job: JobView, status: OperatorJobStatus) -> JobView:
    """``job`` with ``status`` said on it: phase, pod counts and the generation seen as
    said; the last plan and the ``Suspended`` condition as said, or as they were where
    ``status`` leaves them unsaid (None). The spec, version and generation are the job's."""
    before = job.status
    said = OperatorJobStatus(
        phase=status.phase,
        roles=_counts(before.roles if before is not None else {}, status.roles),
        observed_generation=status.observed_generation,
        last_plan_id=(
            status.last_plan_id
            if status.last_plan_id is not None or before is None
            else before.last_plan_id
        ),
        last_plan_time=(
            status.last_plan_time
            if status.last_plan_time is not None or before is None
            else before.last_plan_time
        ),
        suspended=(
            status.suspended if status.suspended is not None or before is None else before.suspended
        ),
    )
    return replace(job, status=said, phase=said.phase, last_plan_id=said.last_plan_id)


def spec_changed(before: JobView, after: JobView) -> bool:
    """Whether ``after`` asks for other pods than ``before`` (replicas, resources,
    suspend): what moves a job's generation, as a change of its spec does on Kubernetes.
    The per-node state and the plans applied are the job's annotations there: no new
    generation."""
    return before.roles != after.roles or before.suspended != after.suspended


__all__ = ["apply_change", "apply_status", "spec_changed"]
