"""What happened to each job of an env, folded from its events: the evaluators' input.

Pure and order-independent: ``observe`` records facts (when, what allocation, which plan,
which pod) and every KPI is derived from them afterwards, so events that arrive out of
order across topics (a ScaleResult before its ScalePlan, a start before the submission)
give the same numbers. A job's own pod events are taken in the order they were read, as
they come on one partition. No clock, no I/O: the same events give the same KPIs anywhere.

GPUs count while a job holds them, not while a plan says it should. An applied plan only
says what the job's gang is to be: under a cluster scheduler a gang that does not fit yet
waits (the result still says applied, "waiting for room"), a suspended job holds nothing
until a later plan resumes it and its pods start again, and a job's pods hold their GPUs
from the moment they start, while the job still loads, not from its JobStarted. So where
the platform reports its pods (node.started, node.exited, node.failed), a job holds the
GPUs of the pods that run and that its latest applied plans still want; a job whose pods
were never reported holds its allocation from its start, as before.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from schemas.envelope import Event
from schemas.experiments import ExperimentSubmitted, TrialMetrics, trial_of_job
from schemas.jobs import (
    JobCompleted,
    JobFailed,
    JobStarted,
    JobSubmitted,
    NodeExited,
    NodeFailed,
    NodeOOM,
    NodeStarted,
    RuntimeSample,
)
from schemas.lockstep import Barrier, BarrierAck
from schemas.plans import OptimizePlan, ScalePlan, ScaleResult, ScaleStatus

_EPOCH = datetime.min.replace(tzinfo=UTC)

#: Results that say the operator took the plan on: all of it, or (partial) some parts.
ACCEPTED = frozenset({ScaleStatus.APPLIED, ScaleStatus.PARTIAL})


@dataclass(frozen=True, slots=True)
class RoleAllocation:
    """What a plan wants of a role: which replicas (by index, as pods are numbered) and
    the GPUs of each."""

    replicas: frozenset[int]
    gpus: int

    @property
    def gpu_total(self) -> int:
        return len(self.replicas) * self.gpus


JobAllocation = Mapping[str, RoleAllocation]


def gpus_of(allocation: JobAllocation) -> int:
    return sum(role.gpu_total for role in allocation.values())


def _first(count: int) -> frozenset[int]:
    return frozenset(range(count))


def _apply(
    allocation: JobAllocation, plan: ScalePlan, left_out: frozenset[str] = frozenset()
) -> dict[str, RoleAllocation]:
    """The allocation after ``plan``, less the parts its result says were not applied.

    Replicas are numbered as the platforms number pods: a count keeps the lowest indices
    and adds new ones above the highest; removed and launched nodes name theirs.
    """
    out = dict(allocation)
    for role, group in plan.node_group_resources.items():
        if role in left_out:
            continue
        have = out.get(role, RoleAllocation(frozenset(), 0))
        replicas, gpus = have.replicas, have.gpus
        if group.count and f"{role}.count" not in left_out:
            kept = sorted(replicas)[: group.count]
            start = (max(kept) + 1) if kept else 0
            replicas = frozenset(kept) | frozenset(range(start, start + group.count - len(kept)))
        if group.node_resource.gpu_num and f"{role}.gpu_num" not in left_out:
            gpus = group.node_resource.gpu_num
        out[role] = RoleAllocation(replicas, gpus)
    for ref in plan.remove_nodes:
        removed = out.get(ref.type)
        if removed is not None and f"{ref.type}-{ref.id}" not in left_out:
            out[ref.type] = RoleAllocation(removed.replicas - {ref.id}, removed.gpus)
    for node in plan.launch_nodes:
        if node.type in left_out or f"{node.type}-{node.id}" in left_out:
            continue
        have = out.get(node.type, RoleAllocation(frozenset(), 0))
        gpus = node.resource.gpu_num or have.gpus
        out[node.type] = RoleAllocation(have.replicas | {node.id}, gpus)
    return out


def _gives_pods(plan: ScalePlan) -> bool:
    """Whether the plan (re)starts pods: what resumes a suspended job."""
    return bool(
        plan.placement
        or any(g.count for g in plan.node_group_resources.values())
        or plan.launch_nodes
    )


@dataclass(frozen=True, slots=True)
class Applied:
    """A plan the operator took on, when its result said so, and in which order the
    results were read (one job's results come in order, on one partition)."""

    at: datetime
    seq: int
    plan: ScalePlan
    left_out: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class PodFact:
    """A pod of the job started (``running``) or stopped, as the platform said."""

    at: datetime
    seq: int
    role: str
    index: int
    running: bool


#: The label a trial's job carries naming its experiment (streams/searcher/trials.py).
EXPERIMENT_LABEL = "dlrover-events.io/experiment"


@dataclass(frozen=True, slots=True)
class TrialReport:
    """A validation report of a trial: when, at what budget used, what it measured."""

    at: datetime
    budget: float
    metrics: dict[str, float]


@dataclass(frozen=True, slots=True)
class Objective:
    """What an experiment optimizes: its metric, and which way is better."""

    metric: str
    smaller_is_better: bool = True

    def better(self, a: float, b: float) -> bool:
        return a < b if self.smaller_is_better else a > b


@dataclass
class JobRecord:
    job: str
    submitted_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    failed: bool = False
    requested: dict[str, RoleAllocation] = field(default_factory=dict)
    #: every applied ScalePlan (partial ones too), in any order
    applied: list[Applied] = field(default_factory=list)
    #: every start and stop of a pod the platform reported, in any order
    pods: list[PodFact] = field(default_factory=list)
    samples: list[tuple[datetime, float]] = field(default_factory=list)  # (at, samples/s)
    ooms: list[str] = field(default_factory=list)  # node keys, one per OOM event
    optimize_plans: int = 0
    #: the job's name, and the experiment it is a trial of (its name ``<exp>-t<i>`` and
    #: its experiment label agree), with that experiment's objective once known
    name: str = ""
    experiment: str | None = None
    objective: Objective | None = None
    #: a trial's validation reports, in any order
    reports: list[TrialReport] = field(default_factory=list)
    _line: list[tuple[datetime, int]] | None = field(default=None, repr=False, compare=False)

    def changed(self) -> None:
        """A fact was added: the GPU timeline is derived again when next asked."""
        self._line = None

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
        """(since, GPUs the job holds), from the epoch on, 0 again once it ended."""
        if self._line is None:
            self._line = self._held()
        return self._line

    def _held(self) -> list[tuple[datetime, int]]:
        # At one instant the results go first, then the pods in the order they were
        # reported: a job suspended and resumed in one round stops its pods and starts
        # them again, and its resume must not be taken back by the suspend.
        facts: list[tuple[datetime, int, int, Applied | PodFact | None]] = [
            (a.at, 1, a.seq, a) for a in self.applied
        ]
        facts += [(p.at, 2, p.seq, p) for p in self.pods]
        if self.started_at is not None:
            facts.append((self.started_at, 0, 0, None))
        facts.sort(key=lambda f: f[:3])
        by_pods = bool(self.pods)
        allocation: dict[str, RoleAllocation] = dict(self.requested)
        running: dict[str, set[int]] = {}
        started = suspended = False
        line = [(_EPOCH, 0)]
        for at, _, _, fact in facts:
            if self.finished_at is not None and at >= self.finished_at:
                break
            if fact is None:
                started = True
            elif isinstance(fact, PodFact):
                pods = running.setdefault(fact.role, set())
                if fact.running:
                    pods.add(fact.index)
                else:
                    pods.discard(fact.index)
            elif fact.plan.suspend and "suspend" not in fact.left_out:
                suspended = True
                running.clear()
                allocation = _apply(allocation, fact.plan, fact.left_out)
            else:
                allocation = _apply(allocation, fact.plan, fact.left_out)
                suspended = suspended and not _gives_pods(fact.plan)
            if by_pods:
                gpus = sum(
                    len(role.replicas & running.get(name, set())) * role.gpus
                    for name, role in allocation.items()
                )
            else:
                gpus = gpus_of(allocation) if started and not suspended else 0
            if line[-1][0] == at:
                line[-1] = (at, gpus)
            elif line[-1][1] != gpus:
                line.append((at, gpus))
        if self.finished_at is not None:
            line.append((self.finished_at, 0))
        return line

    def gpus_at(self, at: datetime) -> int:
        line = self.timeline()
        i = bisect.bisect_right(line, at, key=lambda point: point[0]) - 1
        return line[max(i, 0)][1]

    def _gpus_measured_at(self, at: datetime) -> int:
        """The GPUs a runtime sample taken at ``at`` was measured on: those held up to
        that instant (a job's last sample comes as it completes, and a sample at a
        round's end comes before the round's plans move the job's pods)."""
        line = self.timeline()
        i = bisect.bisect_left(line, at, key=lambda point: point[0]) - 1
        return line[max(i, 0)][1]

    def gpu_seconds(self, until: datetime | None = None) -> float:
        end = self.finished_at or until
        if end is None:
            return 0.0
        line = self.timeline()
        total = 0.0
        for (since, gpus), (nxt, _) in zip(line, [*line[1:], (end, 0)], strict=True):
            if gpus:
                total += gpus * max(0.0, (min(nxt, end) - since).total_seconds())
        return total

    def throughput_per_gpu(self) -> list[float]:
        return [sps / g for at, sps in self.samples if (g := self._gpus_measured_at(at)) > 0]


@dataclass
class Ledger:
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    plans: dict[str, ScalePlan] = field(default_factory=dict)
    #: plan_id -> (when its accepted result came, in which order it was read)
    applied_at: dict[str, tuple[datetime, int]] = field(default_factory=dict)
    #: plan_id -> parts a partial result did not apply
    left_out: dict[str, frozenset[str]] = field(default_factory=dict)
    last_event_at: datetime | None = None
    #: how many events were observed: the order of facts at one instant
    seen: int = 0
    #: event ids of the pod facts kept: a re-delivered start must not undo a later stop
    pod_events: set[str] = field(default_factory=set)
    #: experiments' objectives, by experiment
    objectives: dict[str, Objective] = field(default_factory=dict)
    #: trials' validation reports by job name, until the trial's job is seen; the trials'
    #: jobs by name; the report ids kept (a report delivered again counts once)
    unclaimed: dict[str, list[TrialReport]] = field(default_factory=dict)
    trial_jobs: dict[str, str] = field(default_factory=dict)
    report_ids: set[str] = field(default_factory=set)

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
        if isinstance(event, ExperimentSubmitted):
            # (stamped by whoever submitted it, not on the jobs' clock: no time of it kept)
            searcher = event.spec.searcher
            objective = Objective(searcher.metric, searcher.smaller_is_better)
            self.objectives.setdefault(event.experiment, objective)
            for rec in self.jobs.values():
                if rec.experiment == event.experiment and rec.objective is None:
                    rec.objective = self.objectives[event.experiment]
            return
        self.seen += 1
        at = event.occurred_at
        if self.last_event_at is None or at > self.last_event_at:
            self.last_event_at = at
        if isinstance(event, JobSubmitted):
            rec = self.job(event.job.uuid)
            rec.submitted_at = min(rec.submitted_at or at, at)
            rec.requested = {
                r: RoleAllocation(_first(s.replicas), s.gpu_num) for r, s in event.roles.items()
            }
            rec.name = event.job.name
            found = trial_of_job(event.job.name)
            if found is not None and event.job.labels.get(EXPERIMENT_LABEL) == found[0]:
                rec.experiment = found[0]
                rec.objective = self.objectives.get(found[0])
                self.trial_jobs[event.job.name] = rec.job
                rec.reports.extend(self.unclaimed.pop(event.job.name, []))
            rec.changed()
        elif isinstance(event, TrialMetrics):
            if event.validation and str(event.event_id) not in self.report_ids:
                self.report_ids.add(str(event.event_id))
                report = TrialReport(at, event.budget, dict(event.metrics))
                name = f"{event.experiment}-t{event.trial}"
                owner = self.trial_jobs.get(name)
                if owner is None:
                    self.unclaimed.setdefault(name, []).append(report)
                else:
                    self.jobs[owner].reports.append(report)
        elif isinstance(event, JobStarted):
            rec = self.job(event.job.uuid)
            rec.started_at = min(rec.started_at or at, at)
            rec.changed()
        elif isinstance(event, JobCompleted | JobFailed):
            rec = self.job(event.job.uuid)
            if rec.finished_at is None or at < rec.finished_at:
                rec.finished_at = at
                rec.failed = isinstance(event, JobFailed)
                rec.changed()
        elif isinstance(event, NodeStarted | NodeExited | NodeFailed):
            key = str(event.event_id)
            if key not in self.pod_events:
                self.pod_events.add(key)
                rec = self.job(event.job.uuid)
                running = isinstance(event, NodeStarted)
                rec.pods.append(PodFact(at, self.seen, event.node.type, event.node.id, running))
                rec.changed()
        elif isinstance(event, NodeOOM):
            # A pod out of memory restarts in place (or crash-loops): it keeps its GPUs.
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
            self.applied_at[event.plan_id] = (at, self.seen)
            if event.not_applied:
                self.left_out[event.plan_id] = frozenset(p.part for p in event.not_applied)
            self._settle(event.plan_id)

    def _settle(self, plan_id: str) -> None:
        """Once both the plan and its applied result are known, the job's allocation moves."""
        plan, applied = self.plans.get(plan_id), self.applied_at.get(plan_id)
        if plan is not None and applied is not None:
            rec = self.job(plan.job.uuid)
            at, seq = applied
            rec.applied.append(Applied(at, seq, plan, self.left_out.get(plan_id, frozenset())))
            rec.changed()

    def in_window(self, start: datetime | None, end: datetime | None) -> list[JobRecord]:
        """Jobs submitted in [start, end); jobs never seen submitted are left out."""
        return [
            j
            for j in self.jobs.values()
            if j.submitted_at is not None
            and (start is None or j.submitted_at >= start)
            and (end is None or j.submitted_at < end)
        ]


def gpus_held(jobs: Iterable[JobRecord]) -> list[tuple[datetime, int]]:
    """Every change of the GPUs the jobs hold together: (since, GPUs), exact (what a
    cluster's capacity bounds at every moment, where a sampled chart could miss a peak)."""
    changes: list[tuple[datetime, int]] = []
    for job in jobs:
        before = 0
        for since, gpus in job.timeline():
            if gpus != before:
                changes.append((since, gpus - before))
                before = gpus
    out: list[tuple[datetime, int]] = []
    total = 0
    for since, delta in sorted(changes):
        total += delta
        if out and out[-1][0] == since:
            out[-1] = (since, total)
        else:
            out.append((since, total))
    return out


def gpu_use(jobs: list[JobRecord], step_s: float = 60.0) -> list[tuple[float, int]]:
    """Cluster-wide GPUs held over time, every ``step_s``: (seconds since the first job
    held GPUs, GPUs)."""
    held = gpus_held(jobs)
    if not held:
        return []
    t0, t1 = held[0][0], held[-1][0]
    series: list[tuple[float, int]] = []
    n = int((t1 - t0).total_seconds() // step_s) + 1
    times = [since for since, _ in held]
    for i in range(n + 1):
        at = t0 + timedelta(seconds=i * step_s)
        series.append((i * step_s, held[bisect.bisect_right(times, at) - 1][1]))
    return series
