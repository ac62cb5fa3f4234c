"""What the console shows of an env, folded from its topics: each job (its current
resources, its timeline of plans, results and confirmations, its world size and throughput
over time), the evaluators' latest reports and the dead letters.

Pure and synchronous, like every fold in the project: the hub feeds it events in topic
order and the page asks for a snapshot. "Current resources" are what the job asked for
at submission, updated by every scale plan the operator reported as applied (or partial:
then less the parts it did not apply); the usage is the last runtime sample's.

Everything here is bounded, so a console that runs for months holds no more than it did
after a day: jobs (the quietest forgotten first), each job's timeline (the oldest entries
dropped) and its series (thinned, so a chart still spans the job's whole life), the
evaluators, the dead letters.
"""

from __future__ import annotations

import base64
import binascii
import math
from array import array
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dlrover_events.bus.tail import summary
from dlrover_events.domain.units import human_bytes
from schemas.dlq import DeadLetter
from schemas.envelope import Event
from schemas.evaluation import EvaluationReport
from schemas.jobs import (
    JobCompleted,
    JobEvent,
    JobFailed,
    JobStarted,
    JobSubmitted,
    NodeFailed,
    NodeOOM,
    RuntimeSample,
)
from schemas.plans import (
    NodeGroupResource,
    NodeResource,
    OptimizePlan,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
    TrainingApplied,
    TrainingRescaled,
)

#: Scale plans (or results) waiting for their other half, per job; older ones are forgotten.
MAX_OPEN_PLANS = 16
#: What a job's row says while an applied plan has it suspended (ended jobs say how).
SUSPENDED = "suspended"
STATUS_ORDER = {"seen": 0, "submitted": 1, "running": 2, "completed": 3, "failed": 3}
#: What a job's timeline tells: its lifecycle, what was planned for it, what the operator
#: did, and what the job itself confirmed.
TIMELINE_TYPES = (
    JobSubmitted,
    JobStarted,
    JobCompleted,
    JobFailed,
    NodeFailed,
    NodeOOM,
    OptimizePlan,
    ScalePlan,
    ScaleResult,
    TrainingApplied,
    TrainingRescaled,
)
#: Bytes of a dead letter's original value shown (as text) beside its reason.
PREVIEW_BYTES = 240


class Series:
    """Points over a job's whole life in bounded memory: when ``size`` points are kept,
    every other one is dropped and from then on only every ``stride``-th new one is kept
    (the newest is always shown), so a chart of a month-long job still starts at its
    first sample. Columns of doubles (NaN: no world size reported), not objects: a board
    of thousands of jobs holds a few MiB of points."""

    COLUMNS = ("t", "world_size", "speed", "samples_per_s")

    def __init__(self, size: int) -> None:
        self.size = max(size, 4)
        self.stride = 1
        self._seen = 0
        self._kept = [array("d") for _ in self.COLUMNS]
        self._last: tuple[float, float, float, float] | None = None
        self._last_kept = False

    def add(self, t: float, world_size: int | None, speed: float, samples_per_s: float) -> None:
        point = (t, math.nan if world_size is None else float(world_size), speed, samples_per_s)
        self._last, self._last_kept = point, False
        if self._seen % self.stride == 0:
            for column, value in zip(self._kept, point, strict=True):
                column.append(value)
            self._last_kept = True
            full = len(self._kept[0])
            if full >= self.size:
                self._kept = [column[::2] for column in self._kept]
                self.stride *= 2
                self._last_kept = (full - 1) % 2 == 0  # did the newest survive the thinning?
        self._seen += 1

    def __len__(self) -> int:
        return len(self._kept[0])

    def as_json(self) -> dict[str, list[Any]]:
        """Columns, as a chart takes them: seconds since the epoch, then one per measure."""
        columns: list[list[Any]] = [list(c) for c in self._kept]
        if self._last is not None and not self._last_kept:
            for column, value in zip(columns, self._last, strict=True):
                column.append(value)
        columns[1] = [None if math.isnan(v) else int(v) for v in columns[1]]
        return dict(zip(self.COLUMNS, columns, strict=True))


@dataclass(frozen=True, slots=True)
class OpenPlan:
    """A scale plan of the job read and not answered yet: what its result would change."""

    groups: dict[str, NodeGroupResource]
    suspend: bool = False
    #: it gives the job replicas (a count or nodes to launch): applied, it resumes a
    #: suspended job
    gives_count: bool = False


@dataclass
class JobRow:
    job: str
    #: (at, type, source, plan_id, status, text, again, last_at): tuples, not dicts, to
    #: keep them small
    timeline: deque[TimelineEntry]
    series: Series
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
    world_size: int | None = None
    ooms: int = 0
    last_oom: str | None = None
    last_plan: dict[str, Any] | None = None
    last_scale: dict[str, Any] | None = None
    updated_at: datetime | None = None
    #: an applied plan suspended it (its nodes stopped, the job kept) and no plan that
    #: gives it a count resumed it since
    suspended: bool = False
    #: what the newest timeline entry planned, when it is the brain's plan: the same plan
    #: again (the brain re-plans as usage moves) counts on that entry, not a new one
    repeating: tuple[Any, ...] | None = None
    #: plans read but not answered yet
    open_plans: dict[str, OpenPlan] = field(default_factory=dict)
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

    def current_usage(self, resources: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
        """The last usage of the nodes the job has now: a scale-down removes a role's
        highest ranks, whose last samples would otherwise be shown for ever."""
        out = {}
        for node, use in self.usage.items():
            role, _, rank = node.rpartition("-")
            replicas = resources.get(role, {}).get("replicas")
            if replicas and rank.isdigit() and int(rank) >= replicas:
                continue
            out[node] = use
        return out

    def as_json(self) -> dict[str, Any]:
        resources = self.resources
        usage = self.current_usage(resources)
        ended = STATUS_ORDER[self.status] >= STATUS_ORDER["completed"]
        return {
            "job": self.job,
            "name": self.name,
            "status": SUSPENDED if self.suspended and not ended else self.status,
            "suspended": self.suspended,
            "events": self.events,
            "application": self.application,
            "resources": resources,
            "resources_text": resources_text(resources),
            "usage": usage,
            "usage_text": usage_text(dict(sorted(usage.items()))),
            "global_step": self.global_step,
            "speed": self.speed,
            "samples_per_s": self.samples_per_s,
            "world_size": self.world_size,
            "ooms": self.ooms,
            "last_oom": self.last_oom,
            "last_plan": self.last_plan,
            "last_scale": self.last_scale,
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
        }

    def detail(self) -> dict[str, Any]:
        """The job's page: the row, its timeline (oldest first) and its series."""
        timeline = [
            {
                "at": at.isoformat(),
                "type": kind,
                "source": source,
                "plan_id": plan_id,
                "status": status,
                "text": text,
                "again": again,
                "last_at": last_at.isoformat() if last_at else None,
            }
            for at, kind, source, plan_id, status, text, again, last_at in sorted(
                self.timeline, key=_at
            )
        ]
        return {**self.as_json(), "timeline": timeline, "series": self.series.as_json()}


@dataclass
class ReportRow:
    """An evaluator's latest report, and how many identical ones followed it: evaluators
    report every few seconds, mostly the same values, which would bury everything else."""

    report: dict[str, Any]
    repeats: int = 0
    last_at: str = ""

    def as_json(self) -> dict[str, Any]:
        return {**self.report, "repeats": self.repeats, "last_at": self.last_at}


def report_key(report: EvaluationReport) -> tuple[Any, ...]:
    """What makes a report news: its jobs and values (its window always moves on)."""
    return (report.jobs, tuple(sorted(report.metrics.items())))


class Board:
    def __init__(
        self,
        max_reports: int = 64,
        max_jobs: int = 2000,
        *,
        timeline: int = 50,
        points: int = 240,
        max_letters: int = 200,
    ) -> None:
        self.jobs: dict[str, JobRow] = {}
        #: per evaluator, the most recently active last; at most ``max_reports``.
        self.reports: dict[str, ReportRow] = {}
        self._report_keys: dict[str, tuple[Any, ...]] = {}
        self.letters: deque[dict[str, Any]] = deque(maxlen=max_letters)
        #: dead letters and unreadable messages seen since the console started
        self.letters_seen = 0
        self.max_reports = max_reports
        self.max_jobs = max_jobs
        self.timeline_size = timeline
        self.points = points

    def apply(self, event: Event) -> bool:
        """Fold one event; False when it only repeats what the board shows already (an
        evaluator's report with the same values as its last), which a page need not list
        again."""
        if isinstance(event, EvaluationReport):
            return self._report(event)
        if isinstance(event, DeadLetter):
            self._letter(letter_row(event))
            return True
        if not isinstance(event, JobEvent):
            return True
        view = self.jobs.pop(event.job.uuid, None) or JobRow(
            job=event.job.uuid,
            timeline=deque(maxlen=self.timeline_size),
            series=Series(self.points),
        )
        # Re-inserted on every event: the dict's order is the order of last activity, and a
        # console that runs for months forgets the jobs that went quiet longest ago.
        self.jobs[event.job.uuid] = view
        if len(self.jobs) > self.max_jobs:
            self.jobs.pop(next(iter(self.jobs)))
        view.name = event.job.name or view.name
        view.updated_at = event.occurred_at
        view.events += 1
        _fold(view, event)
        if isinstance(event, TIMELINE_TYPES):
            _note(view, event)
        return True

    def unreadable(self, topic: str, partition: int, offset: int, error: str | None) -> None:
        """A message the console itself could not decode: shown with the dead letters."""
        self._letter(
            {
                "at": None,
                "original_topic": topic,
                "partition": partition,
                "offset": offset,
                "kind": "unreadable",
                "error": error or "",
                "consumer_group": "console",
                "size": None,
                "truncated": False,
                "preview": "",
            }
        )

    def _letter(self, row: dict[str, Any]) -> None:
        self.letters.append(row)
        self.letters_seen += 1

    def _report(self, report: EvaluationReport) -> bool:
        key = report_key(report)
        row = self.reports.pop(report.evaluator, None)
        at = report.occurred_at.isoformat()
        news = row is None or self._report_keys.get(report.evaluator) != key
        if news:
            row = ReportRow(report.model_dump(mode="json"), last_at=at)
            self._report_keys[report.evaluator] = key
        else:
            assert row is not None
            row.repeats += 1
            row.last_at = at
        self.reports[report.evaluator] = row
        if len(self.reports) > self.max_reports:
            gone = next(iter(self.reports))
            self.reports.pop(gone)
            self._report_keys.pop(gone, None)
        return news

    def report_rows(self) -> list[dict[str, Any]]:
        """The evaluators' latest reports, by name."""
        return [self.reports[name].as_json() for name in sorted(self.reports)]

    def snapshot(self) -> list[dict[str, Any]]:
        """Jobs, the most recently active first."""
        views = sorted(
            self.jobs.values(), key=lambda v: (v.updated_at is not None, v.updated_at), reverse=True
        )
        return [v.as_json() for v in views]

    def job(self, key: str) -> JobRow | None:
        """A job by its uuid, else by its name (the most recently active of that name)."""
        if key in self.jobs:
            return self.jobs[key]
        named = [v for v in self.jobs.values() if v.name == key]
        return named[-1] if named else None


def letter_row(letter: DeadLetter) -> dict[str, Any]:
    preview = ""
    if letter.original_value:
        # only the first bytes are decoded: a letter may hold hundreds of KiB
        head = letter.original_value[: PREVIEW_BYTES * 4 // 3]
        try:
            preview = base64.b64decode(head[: len(head) // 4 * 4]).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            preview = ""
    return {
        "at": letter.occurred_at.isoformat(),
        "original_topic": letter.original_topic,
        "partition": letter.partition,
        "offset": letter.offset,
        "kind": letter.error_kind.value,
        "error": letter.error,
        "consumer_group": letter.consumer_group,
        "size": letter.original_size,
        "truncated": letter.truncated,
        "preview": preview,
    }


TimelineEntry = tuple[datetime, str, str, str | None, str | None, str, int, datetime | None]


def _at(entry: TimelineEntry) -> datetime:
    return entry[0]


def timeline_entry(event: JobEvent) -> TimelineEntry:
    status = event.status.value if isinstance(event, ScaleResult) else None
    plan_id = getattr(event, "plan_id", None)
    return (event.occurred_at, event.type, event.source, plan_id, status, summary(event), 0, None)


def plan_ask(plan: OptimizePlan) -> tuple[Any, ...]:
    """What a plan asks for, as the page says it (sizes in binary units, three digits): a
    plan whose ask reads the same as the one before is the same plan again."""

    def resource(r: NodeResource) -> tuple[Any, ...]:
        return (
            round(r.cpu, 3),
            human_bytes(r.memory),
            r.gpu_num,
            r.gpu_type,
            human_bytes(r.gpu_memory),
            r.priority,
        )

    res = plan.resource
    groups = res.node_group_resources.items()
    return (
        plan.optimizer,
        tuple(sorted((k, g.count, resource(g.node_resource)) for k, g in groups)),
        tuple(sorted((k, resource(r)) for k, r in res.node_resources.items())),
        tuple(sorted((k, repr(v)) for k, v in res.training.items())),
    )


def _note(view: JobRow, event: JobEvent) -> None:
    """Add the event to the job's timeline; a brain's plan that asks for what its plan
    just before asked for is counted on that one (its reason's numbers moved, nothing
    else), so a few minutes of re-planning do not push the job's history out."""
    plan = plan_ask(event) if isinstance(event, OptimizePlan) else None
    if plan is not None and view.timeline and view.repeating == plan:
        first = view.timeline[-1]
        view.timeline[-1] = (*first[:6], first[6] + 1, event.occurred_at)
        return
    view.timeline.append(timeline_entry(event))
    view.repeating = plan


def resources_text(resources: dict[str, dict[str, float]]) -> str:
    """``worker 4x 4 cpu 16 GiB; ps 1x ...``: sizes in binary units, never raw bytes."""
    parts = []
    for role, r in resources.items():
        words = [f"{role} {int(r.get('replicas', 0)) or '?'}x"]
        if r.get("cpu"):
            words.append(f"{r['cpu']:g} cpu")
        if r.get("memory"):
            words.append(human_bytes(r["memory"]))
        if r.get("gpu_num"):
            words.append(f"{int(r['gpu_num'])} gpu")
        if r.get("gpu_memory"):
            words.append(f"gpu {human_bytes(r['gpu_memory'])}")
        parts.append(" ".join(words))
    return "; ".join(parts)


def usage_text(usage: dict[str, dict[str, Any]]) -> str:
    """``worker-0 1.5 GiB gpu 20 GiB; ...``: what each node used at the last sample."""
    parts = []
    for node, u in usage.items():
        words = [node]
        if u.get("memory"):
            words.append(human_bytes(u["memory"]))
        if u.get("gpu_memory"):
            words.append(f"gpu {human_bytes(u['gpu_memory'])}")
        parts.append(" ".join(words))
    return "; ".join(parts)


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
            view.world_size = event.world_size or view.world_size
            view.series.add(
                event.occurred_at.timestamp(), event.world_size, event.speed, event.samples_per_s
            )
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
            planned = OpenPlan(
                groups,
                suspend=event.suspend,
                gives_count=any(g.count for g in groups.values()) or bool(event.launch_nodes),
            )
            if left_out is not None:
                # Plans and results are on two topics: the result may be read first.
                _applied(view, planned, left_out)
                return
            view.open_plans[event.plan_id] = planned
            _bound(view.open_plans)
        case ScaleResult():
            view.last_scale = {
                "plan_id": event.plan_id,
                "status": event.status.value,
                "reason": event.reason,
                "not_applied": [p.model_dump() for p in event.not_applied],
                "at": event.occurred_at.isoformat(),
            }
            answered = view.open_plans.pop(event.plan_id, None)
            if event.status not in (ScaleStatus.APPLIED, ScaleStatus.PARTIAL):
                return
            # partial: accepted and applied but for the parts it names
            left_out = frozenset(p.part for p in event.not_applied)
            if answered is None:
                view.applied[event.plan_id] = left_out
                _bound(view.applied)
            else:
                _applied(view, answered, left_out)


def _advance(view: JobRow, status: str) -> None:
    """Status only moves on: events of one job come on several topics, in any order."""
    if STATUS_ORDER[status] > STATUS_ORDER[view.status]:
        view.status = status


def _applied(view: JobRow, plan: OpenPlan, left_out: frozenset[str]) -> None:
    """A plan the operator applied: a suspend stops the job (it keeps its resources); a
    plan that gives it a count resumes it, as the platforms read a plan
    (handlers.operator.reconcile.planning.resumes)."""
    if plan.suspend:
        view.suspended = True
        return
    _apply_groups(view, plan.groups, left_out)
    if plan.gives_count:
        view.suspended = False


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
