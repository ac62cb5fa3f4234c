"""What happened to each job of an env, folded from its events: the evaluators' input.

Pure and order-independent: ``observe`` records facts (when, what allocation, which plan)
and every KPI is derived from them afterwards, so events that arrive out of order across
topics (a ScaleResult before its ScalePlan, a start before the submission) give the same
numbers. No clock, no I/O: the same events give the same KPIs anywhere.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from schemas.envelope import Event
from schemas.jobs import (
    JobCompleted,
    JobFailed,
    JobStarted,
    JobSubmitted,
    NodeOOM,
    RuntimeSample,
)
from schemas.lockstep import Barrier, BarrierAck
from schemas.plans import OptimizePlan, ScalePlan, ScaleResult, ScaleStatus

Allocation = dict[str, tuple[int, int]]  # role -> (replicas, gpus per replica)
_EPOCH = datetime.min.replace(tzinfo=UTC)


def gpus_of(allocation: Allocation) -> int:
    return sum(replicas * gpus for replicas, gpus in allocation.values())


#: Results that say the operator took the plan on: all of it, or (partial) some parts.
ACCEPTED = frozenset({ScaleStatus.APPLIED, ScaleStatus.PARTIAL})


def _apply(
    allocation: Allocation, plan: ScalePlan, left_out: frozenset[str] = frozenset()
) -> Allocation:
    """The allocation after ``plan``, less the parts its result says were not applied."""
    out = dict(allocation)
    for role, group in plan.node_group_resources.items():
        if role in left_out:
            continue
        replicas, gpus = out.get(role, (0, 0))
        if group.count and f"{role}.count" not in left_out:
            replicas = group.count
        if group.node_resource.gpu_num and f"{role}.gpu_num" not in left_out:
            gpus = group.node_resource.gpu_num
        out[role] = (replicas, gpus)
    return out


@dataclass
class JobRecord:
    job: str
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    failed: bool = False
    requested: Allocation = field(default_factory=dict)
    #: (applied at, plan) for every applied ScalePlan (partial ones too), in any order
    applied: list[tuple[datetime, ScalePlan]] = field(default_factory=list)
    #: plan_id -> the parts a partial result said were not applied
    left_out: dict[str, frozenset[str]] = field(default_factory=dict)
    samples: list[tuple[datetime, float]] = field(default_factory=list)  # (at, samples/s)
    ooms: list[str] = field(default_factory=list)  # node keys, one per OOM event
    optimize_plans: int = 0

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

    def timeline(self) -> list[tuple[datetime, int]]:
        """(since, GPUs): the requested allocation, then each applied plan in time order."""
        out = [(_EPOCH, gpus_of(self.requested))]
        allocation = self.requested
        for at, plan in sorted(self.applied, key=lambda ap: (ap[0], ap[1].plan_id)):
            allocation = _apply(allocation, plan, self.left_out.get(plan.plan_id, frozenset()))
            out.append((at, gpus_of(allocation)))
        return out

    def gpus_at(self, at: datetime) -> int:
        line = self.timeline()
        i = bisect.bisect_right([since for since, _ in line], at) - 1
        return line[max(i, 0)][1]

    def gpu_seconds(self, until: datetime | None = None) -> float:
        end = self.finished_at or until
        if self.started_at is None or end is None:
            return 0.0
        line = self.timeline()
        total = 0.0
        for (since, gpus), (nxt, _) in zip(line, [*line[1:], (end, 0)], strict=True):
            lo, hi = max(since, self.started_at), min(nxt, end)
            total += gpus * max(0.0, (hi - lo).total_seconds())
        return total

    def throughput_per_gpu(self) -> list[float]:
        return [sps / g for at, sps in self.samples if (g := self.gpus_at(at)) > 0]


@dataclass
class Ledger:
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    plans: dict[str, ScalePlan] = field(default_factory=dict)
    applied_at: dict[str, datetime] = field(default_factory=dict)  # plan_id -> when
    #: plan_id -> parts a partial result did not apply
    left_out: dict[str, frozenset[str]] = field(default_factory=dict)
    last_event_at: datetime | None = None

    def job(self, uuid: str) -> JobRecord:
        rec = self.jobs.get(uuid)
        if rec is None:
            rec = self.jobs[uuid] = JobRecord(uuid)
        return rec

    def observe(self, event: Event) -> None:
        if isinstance(event, Barrier | BarrierAck):
            # The simulated clock's ticks, not facts about jobs: a barrier stamped at its
            # tick's end would stretch the window past the last thing that happened.
            return
        at = event.occurred_at
        if self.last_event_at is None or at > self.last_event_at:
            self.last_event_at = at
        if isinstance(event, JobSubmitted):
            rec = self.job(event.job.uuid)
            rec.submitted_at = min(rec.submitted_at or at, at)
            rec.requested = {r: (s.replicas, s.gpu_num) for r, s in event.roles.items()}
        elif isinstance(event, JobStarted):
            rec = self.job(event.job.uuid)
            rec.started_at = min(rec.started_at or at, at)
        elif isinstance(event, JobCompleted | JobFailed):
            rec = self.job(event.job.uuid)
            if rec.finished_at is None or at < rec.finished_at:
                rec.finished_at = at
                rec.failed = isinstance(event, JobFailed)
        elif isinstance(event, NodeOOM):
            self.job(event.job.uuid).ooms.append(f"{event.node.type}-{event.node.id}")
        elif isinstance(event, RuntimeSample):
            self.job(event.job.uuid).samples.append((at, event.samples_per_s))
        elif isinstance(event, OptimizePlan):
            self.job(event.job.uuid).optimize_plans += 1
        elif isinstance(event, ScalePlan) and event.plan_id not in self.plans:
            self.plans[event.plan_id] = event
            self._settle(event.plan_id)
        elif (
            isinstance(event, ScaleResult)
            and event.status in ACCEPTED
            and event.plan_id not in self.applied_at
        ):
            # partial is accepted too: the plan changed the job, only not all of it
            self.applied_at[event.plan_id] = at
            if event.not_applied:
                self.left_out[event.plan_id] = frozenset(p.part for p in event.not_applied)
            self._settle(event.plan_id)

    def _settle(self, plan_id: str) -> None:
        """Once both the plan and its applied result are known, the job's allocation moves."""
        plan, at = self.plans.get(plan_id), self.applied_at.get(plan_id)
        if plan is not None and at is not None:
            rec = self.job(plan.job.uuid)
            rec.applied.append((at, plan))
            if plan_id in self.left_out:
                rec.left_out[plan_id] = self.left_out[plan_id]

    def in_window(self, start: datetime | None, end: datetime | None) -> list[JobRecord]:
        """Jobs submitted in [start, end); jobs never seen submitted are left out."""
        return [
            j
            for j in self.jobs.values()
            if j.submitted_at is not None
            and (start is None or j.submitted_at >= start)
            and (end is None or j.submitted_at < end)
        ]


def gpu_use(jobs: list[JobRecord], step_s: float = 60.0) -> list[tuple[float, int]]:
    """Cluster-wide GPUs allocated over time: (seconds since the first start, GPUs)."""
    started = [j for j in jobs if j.started_at is not None]
    if not started:
        return []
    t0 = min(j.started_at for j in started if j.started_at is not None)
    t1 = max((j.finished_at or j.started_at) for j in started if j.started_at is not None)
    series: list[tuple[float, int]] = []
    n = int((t1 - t0).total_seconds() // step_s) + 1
    for i in range(n + 1):
        at = t0 + timedelta(seconds=i * step_s)
        gpus = sum(
            j.gpus_at(at)
            for j in started
            if j.started_at is not None
            and j.started_at <= at
            and (j.finished_at is None or at < j.finished_at)
        )
        series.append((i * step_s, gpus))
    return series
