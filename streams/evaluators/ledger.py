"""What happened to each job of an env, folded from its events: the evaluators' input.

Pure: ``observe`` folds one event; nothing here reads a clock or does I/O, so the same
events give the same KPIs, in a test, in a virtual env, and in production.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from schemas.envelope import Event
from schemas.jobs import (
    JobCompleted,
    JobFailed,
    JobStarted,
    JobSubmitted,
    NodeOOM,
    RuntimeSample,
)
from schemas.plans import OptimizePlan, ScalePlan, ScaleResult, ScaleStatus

#: Roles whose GPUs count; every role with gpu_num > 0 does.
Allocation = dict[str, tuple[int, int]]  # role -> (replicas, gpus per replica)


def gpus_of(allocation: Allocation) -> int:
    return sum(replicas * gpus for replicas, gpus in allocation.values())


@dataclass
class JobRecord:
    job: str
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    failed: bool = False
    allocation: Allocation = field(default_factory=dict)
    #: (since, gpus): the job's GPU count over time, from start to finish
    gpu_timeline: list[tuple[datetime, int]] = field(default_factory=list)
    #: (at, samples/s, gpus then)
    throughput: list[tuple[datetime, float, int]] = field(default_factory=list)
    ooms: list[str] = field(default_factory=list)  # node keys, one per OOM event
    plans: int = 0
    scale_plans_applied: int = 0

    @property
    def done(self) -> bool:
        return self.finished_at is not None

    def jct_s(self) -> float | None:
        if self.submitted_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.submitted_at).total_seconds()

    def queueing_s(self) -> float | None:
        if self.submitted_at is None or self.started_at is None:
            return None
        return max(0.0, (self.started_at - self.submitted_at).total_seconds())

    def run_s(self, until: datetime | None = None) -> float:
        end = self.finished_at or until
        if self.started_at is None or end is None:
            return 0.0
        return max(0.0, (end - self.started_at).total_seconds())

    def gpu_seconds(self, until: datetime | None = None) -> float:
        end = self.finished_at or until
        if end is None:
            return 0.0
        total = 0.0
        for (since, gpus), nxt in zip(
            self.gpu_timeline, [*self.gpu_timeline[1:], (end, 0)], strict=True
        ):
            total += gpus * max(0.0, (min(nxt[0], end) - since).total_seconds())
        return total

    def _set_allocation(self, at: datetime, allocation: Allocation) -> None:
        self.allocation = allocation
        if self.started_at is not None and not self.done:
            self.gpu_timeline.append((at, gpus_of(allocation)))


@dataclass
class Ledger:
    """Jobs of one env, and the ScalePlans seen (to know what an applied result meant)."""

    jobs: dict[str, JobRecord] = field(default_factory=dict)
    pending_plans: dict[str, ScalePlan] = field(default_factory=dict)
    first_event_at: datetime | None = None
    last_event_at: datetime | None = None

    def job(self, uuid: str) -> JobRecord:
        rec = self.jobs.get(uuid)
        if rec is None:
            rec = self.jobs[uuid] = JobRecord(uuid)
        return rec

    def observe(self, event: Event) -> None:
        at = event.occurred_at
        if self.first_event_at is None or at < self.first_event_at:
            self.first_event_at = at
        if self.last_event_at is None or at > self.last_event_at:
            self.last_event_at = at
        if isinstance(event, JobSubmitted):
            rec = self.job(event.job.uuid)
            rec.submitted_at = rec.submitted_at or at
            rec.allocation = {r: (s.replicas, s.gpu_num) for r, s in event.roles.items()}
        elif isinstance(event, JobStarted):
            rec = self.job(event.job.uuid)
            if rec.started_at is None:
                rec.started_at = at
                rec.gpu_timeline.append((at, gpus_of(rec.allocation)))
        elif isinstance(event, JobCompleted | JobFailed):
            rec = self.job(event.job.uuid)
            if rec.finished_at is None:
                rec.finished_at = at
                rec.failed = isinstance(event, JobFailed)
        elif isinstance(event, NodeOOM):
            self.job(event.job.uuid).ooms.append(f"{event.node.type}-{event.node.id}")
        elif isinstance(event, RuntimeSample):
            rec = self.job(event.job.uuid)
            rec.throughput.append((at, event.samples_per_s, gpus_of(rec.allocation)))
        elif isinstance(event, OptimizePlan):
            self.job(event.job.uuid).plans += 1
        elif isinstance(event, ScalePlan):
            self.pending_plans[event.plan_id] = event
        elif isinstance(event, ScaleResult) and event.status == ScaleStatus.APPLIED:
            rec = self.job(event.job.uuid)
            rec.scale_plans_applied += 1
            plan = self.pending_plans.pop(event.plan_id, None)
            if plan is not None:
                allocation = dict(rec.allocation)
                for role, group in plan.node_group_resources.items():
                    replicas, gpus = allocation.get(role, (0, 0))
                    replicas = group.count or replicas
                    gpus = group.node_resource.gpu_num or gpus
                    allocation[role] = (replicas, gpus)
                rec._set_allocation(at, allocation)

    def in_window(self, start: datetime | None, end: datetime | None) -> list[JobRecord]:
        """Jobs submitted in [start, end); jobs never seen submitted are left out."""
        return [
            j
            for j in self.jobs.values()
            if j.submitted_at is not None
            and (start is None or j.submitted_at >= start)
            and (end is None or j.submitted_at < end)
        ]
