"""What the console shows about each job, folded from the env's topics.

Pure and synchronous, like every fold in the project: the hub feeds it events in topic
order and the page asks for a snapshot. "Current resources" are what the job asked for
at submission, updated by every scale plan the operator reported as applied (or partial:
then less the parts it did not apply); the usage is the last runtime sample's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from schemas.envelope import Event
from schemas.evaluation import EvaluationReport
from schemas.jobs import (
    JobCompleted,
    JobEvent,
    JobFailed,
    JobStarted,
    JobSubmitted,
    NodeOOM,
    RuntimeSample,
)
from schemas.plans import NodeGroupResource, OptimizePlan, ScalePlan, ScaleResult, ScaleStatus

#: Scale plans (or results) waiting for their other half, per job; older ones are forgotten.
MAX_OPEN_PLANS = 16
STATUS_ORDER = {"seen": 0, "submitted": 1, "running": 2, "completed": 3, "failed": 3}


@dataclass
class JobRow:
    job: str
    name: str = ""
    status: str = "seen"
    application: str = ""
    #: per role, as submitted: replicas, cpu (cores), memory (bytes), gpu_num.
    submitted: dict[str, dict[str, float]] = field(default_factory=dict)
    #: per role, what applied scale plans changed (replicas, cpu, memory, gpu_memory...).
    scaled: dict[str, dict[str, float]] = field(default_factory=dict)
    #: events of this job folded so far.
    events: int = 0
    #: per node (``worker-0``): the last sample's usage.
    usage: dict[str, dict[str, Any]] = field(default_factory=dict)
    global_step: int | None = None
    speed: float | None = None
    samples_per_s: float | None = None
    ooms: int = 0
    last_oom: str | None = None
    last_plan: dict[str, Any] | None = None
    last_scale: dict[str, Any] | None = None
    updated_at: datetime | None = None
    open_plans: dict[str, dict[str, NodeGroupResource]] = field(default_factory=dict)
    #: plans reported applied (or partial) before the plan itself was read, with the parts
    #: the result did not apply.
    applied: dict[str, frozenset[str]] = field(default_factory=dict)

    @property
    def resources(self) -> dict[str, dict[str, float]]:
        """Now: the submission, overridden by applied plans (whichever was read first)."""
        roles = {role: dict(spec) for role, spec in self.submitted.items()}
        for role, changed in self.scaled.items():
            roles.setdefault(role, {}).update(changed)
        return roles

    def as_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "name": self.name,
            "status": self.status,
            "events": self.events,
            "application": self.application,
            "resources": self.resources,
            "usage": self.usage,
            "global_step": self.global_step,
            "speed": self.speed,
            "samples_per_s": self.samples_per_s,
            "ooms": self.ooms,
            "last_oom": self.last_oom,
            "last_plan": self.last_plan,
            "last_scale": self.last_scale,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
        }


class Board:
    def __init__(self, max_reports: int = 50, max_jobs: int = 2000) -> None:
        self.jobs: dict[str, JobRow] = {}
        self.reports: deque[dict[str, Any]] = deque(maxlen=max_reports)
        self.max_jobs = max_jobs

    def apply(self, event: Event) -> None:
        if isinstance(event, EvaluationReport):
            self.reports.append(event.model_dump(mode="json"))
            return
        if not isinstance(event, JobEvent):
            return
        view = self.jobs.pop(event.job.uuid, None) or JobRow(job=event.job.uuid)
        # Re-inserted on every event: the dict's order is the order of last activity, and a
        # console that runs for months forgets the jobs that went quiet longest ago.
        self.jobs[event.job.uuid] = view
        if len(self.jobs) > self.max_jobs:
            self.jobs.pop(next(iter(self.jobs)))
        view.name = event.job.name or view.name
        view.updated_at = event.occurred_at
        view.events += 1
        _fold(view, event)

    def snapshot(self) -> list[dict[str, Any]]:
        """Jobs, the most recently active first."""
        views = sorted(
            self.jobs.values(), key=lambda v: (v.updated_at is not None, v.updated_at), reverse=True
        )
        return [v.as_json() for v in views]


def _fold(view: JobRow, event: JobEvent) -> None:
    match event:
        case JobSubmitted():
            _advance(view, "submitted")
            view.application = event.application
            view.submitted = {
                role: {
                    "replicas": spec.replicas,
                    "cpu": spec.cpu,
                    "memory": spec.memory,
                    "gpu_num": spec.gpu_num,
                }
                for role, spec in event.roles.items()
            }
        case JobStarted():
            _advance(view, "running")
        case JobCompleted():
            _advance(view, "completed")
        case JobFailed():
            _advance(view, "failed")
        case RuntimeSample():
            _advance(view, "running")
            view.global_step = event.global_step
            view.speed = event.speed
            view.samples_per_s = event.samples_per_s
            for node in event.nodes:
                view.usage[f"{node.type}-{node.id}"] = node.model_dump(
                    mode="json", exclude={"type", "id"}
                )
        case NodeOOM():
            view.ooms += 1
            view.last_oom = f"{event.node.type}-{event.node.id} {event.kind.value}"
        case OptimizePlan():
            view.last_plan = {
                "plan_id": event.plan_id,
                "optimizer": event.optimizer,
                "stage": event.stage,
                "reason": event.reason,
                "groups": {
                    role: _group(g) for role, g in event.resource.node_group_resources.items()
                },
                "at": event.occurred_at.isoformat(),
            }
        case ScalePlan():
            groups = dict(event.node_group_resources)
            left_out = view.applied.pop(event.plan_id, None)
            if left_out is not None:
                # Plans and results are on two topics: the result may be read first.
                _apply_groups(view, groups, left_out)
                return
            view.open_plans[event.plan_id] = groups
            _bound(view.open_plans)
        case ScaleResult():
            view.last_scale = {
                "plan_id": event.plan_id,
                "status": event.status.value,
                "reason": event.reason,
                "not_applied": [p.model_dump() for p in event.not_applied],
                "at": event.occurred_at.isoformat(),
            }
            planned = view.open_plans.pop(event.plan_id, None)
            if event.status not in (ScaleStatus.APPLIED, ScaleStatus.PARTIAL):
                return
            # partial: accepted and applied but for the parts it names
            left_out = frozenset(p.part for p in event.not_applied)
            if planned is None:
                view.applied[event.plan_id] = left_out
                _bound(view.applied)
            else:
                _apply_groups(view, planned, left_out)


def _advance(view: JobRow, status: str) -> None:
    """Status only moves on: events of one job come on several topics, in any order."""
    if STATUS_ORDER[status] > STATUS_ORDER[view.status]:
        view.status = status


def _bound(plans: dict[str, Any]) -> None:
    while len(plans) > MAX_OPEN_PLANS:
        plans.pop(next(iter(plans)))


def _apply_groups(
    view: JobRow, groups: dict[str, NodeGroupResource], left_out: frozenset[str] = frozenset()
) -> None:
    for role, g in groups.items():
        if role not in left_out:
            _apply(view.scaled.setdefault(role, {}), role, g, left_out)


def _group(g: NodeGroupResource) -> dict[str, Any]:
    r = g.node_resource
    out: dict[str, Any] = {"count": g.count}
    out.update({k: v for k, v in r.model_dump().items() if v})
    return out


def _apply(
    current: dict[str, float], role: str, g: NodeGroupResource, left_out: frozenset[str]
) -> None:
    """A plan's zero means "unchanged", as in DLRover's ResourcePlan; so does a part the
    result names as not applied (``worker.gpu_memory``)."""
    if g.count and f"{role}.count" not in left_out:
        current["replicas"] = g.count
    r = g.node_resource
    for name in ("cpu", "memory", "gpu_num", "gpu_memory"):
        value = getattr(r, name)
        if value and f"{role}.{name}" not in left_out:
            current[name] = value
