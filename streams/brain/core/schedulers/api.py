"""The cluster-scheduler extension point: what a scheduler is given, what it answers, how
it refuses, and what a registered one declares.

A cluster scheduler is a pure function of one round: the time, the cluster's capacity (and
how it is shared), the arrived jobs and the scheduler's own parameters in; the changes to
make and what every job holds afterwards out. The brain builds these inputs from its job
states (`streams.brain.core.cluster_round`), a test or a bench builds them by hand, and
neither needs to know which scheduler answers. The implementations live beside this module
(`goodput_cluster.py`, `tiresias.py`) and are named in the registry (`__init__.py`).

Names here say what the scheduler means, so that they do not collide with the brain's
per-job `Decision`, the simulator's `Allocation` or a platform's cluster: a scheduler
answers `JobChange`s of a `ChangeKind` and the `JobHolding` of every job, over a
`ClusterCapacity` of `NodeCapacity`s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dlrover_events.registry import UnknownName
from schemas.envelope import Model
from streams.brain.core.schedulers.goodput import BatchChoice, JobModel

#: GPUs per node, by node name, in the node order of the cluster; one entry per node used.
Placement = tuple[tuple[str, int], ...]


class SchedulerError(Exception):
    """A round's input a scheduler cannot decide on: the caller's mistake, in one line."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class CapacityError(SchedulerError, ValueError):
    """A capacity that cannot exist: a node listed twice, more GPUs than a whole node."""


class JobInputError(SchedulerError, ValueError):
    """Jobs a round cannot take: one listed twice, a gang of no replicas, no model."""


class UnknownScheduler(SchedulerError, UnknownName):
    """A name no scheduler is registered under (a KeyError, as a mapping's lookup is)."""


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """A node and the GPUs on it the scheduler may hand out: its allocatable GPUs less any
    held by work it does not schedule. `gpu_type` (a platform's label, e.g. a product
    name) lets a job that names one run only there."""

    name: str
    gpus: int
    gpu_type: str | None = None


@dataclass(frozen=True, slots=True)
class GroupQuota:
    """GPUs a group (a team, a user) is guaranteed: its jobs get them back from borrowers
    within one round of asking; GPUs it leaves idle others may borrow meanwhile."""

    group: str
    gpus: int


@dataclass(frozen=True, slots=True)
class ClusterCapacity:
    """What a round may hand out, and who is owed which part of it.

    `nodes` come from the platform (its nodes' allocatable GPUs) or, for a virtual env,
    from its static settings (`uniform`). A job on more than one node takes whole nodes of
    `gpus_per_node` GPUs (0: the largest node's), as Pollux places gangs; a node with
    fewer GPUs than that serves jobs that fit on it alone.
    """

    nodes: tuple[NodeCapacity, ...]
    gpus_per_node: int = 0
    quotas: tuple[GroupQuota, ...] = ()

    def __post_init__(self) -> None:
        if self.gpus_per_node < 0:
            raise CapacityError(f"gpus_per_node must be >= 0, got {self.gpus_per_node}")
        if not self.gpus_per_node:
            object.__setattr__(
                self, "gpus_per_node", max((n.gpus for n in self.nodes), default=1) or 1
            )
        seen: set[str] = set()
        for node in self.nodes:
            if node.name in seen:
                raise CapacityError(f"node {node.name!r} is listed twice")
            seen.add(node.name)
            if not 0 <= node.gpus <= self.gpus_per_node:
                raise CapacityError(
                    f"node {node.name!r} has {node.gpus} GPUs: must be within "
                    f"[0, {self.gpus_per_node}]"
                )
        groups: set[str] = set()
        for quota in self.quotas:
            if quota.group in groups:
                raise CapacityError(f"group {quota.group!r} has two quotas")
            groups.add(quota.group)
            if quota.gpus < 0:
                raise CapacityError(f"group {quota.group!r} has a quota of {quota.gpus} GPUs")

    @classmethod
    def uniform(
        cls, nodes: int, gpus_per_node: int, quotas: Iterable[GroupQuota] = ()
    ) -> ClusterCapacity:
        """`nodes` empty nodes named node-0, node-1, ...: a virtual env's static cluster."""
        if gpus_per_node < 1:
            raise CapacityError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
        return cls(
            tuple(NodeCapacity(f"node-{i}", gpus_per_node) for i in range(nodes)),
            gpus_per_node,
            tuple(quotas),
        )

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def guaranteed(self, held_elsewhere: int = 0) -> dict[str, int]:
        """Each group's quota as a round can honour it: as declared while the quotas fit
        in the GPUs left after `held_elsewhere` (held by work no quota covers), else
        scaled down in proportion (a lost node shrinks every guarantee alike), rounded
        down."""
        free = max(self.total_gpus - held_elsewhere, 0)
        declared = sum(q.gpus for q in self.quotas)
        if declared <= free:
            return {q.group: q.gpus for q in self.quotas}
        return {q.group: math.floor(q.gpus * free / declared) for q in self.quotas}


@dataclass(frozen=True, slots=True)
class JobInput:
    """One job as a scheduler sees it at a round.

    `placement` is what the job holds now (empty: waiting or suspended, its progress kept
    elsewhere); `local_batch` and `accumulation` its current batch when running;
    `restarts` how many times its allocation changed after its first start (Pollux's
    count for the restart penalty, together with its age, now - submitted_at).

    `priority` orders admission (higher first) and `group` names the quota it draws on
    (`ClusterCapacity.quotas`; none: it only borrows). A job `kueue_managed` is admitted
    and suspended by Kueue alone: a scheduler never admits or suspends it, only resizes
    it within the GPUs Kueue gave it. `gpu_type` keeps it to nodes of that type.
    """

    job_id: str
    submitted_at: float
    #: its goodput model; None for a policy that reads none (Tiresias)
    model: JobModel | None = None
    placement: Placement = ()
    local_batch: int | None = None
    accumulation: int = 1
    restarts: int = 0
    preemptible: bool = True
    #: what a policy that does not resize jobs gives it: the replicas it asked for
    requested_replicas: int = 1
    #: GPU-seconds it has held GPUs so far (restarts included): least-attained-service
    #: policies (Tiresias) order jobs by it
    attained_gpu_s: float = 0.0
    priority: int = 0
    group: str | None = None
    kueue_managed: bool = False
    gpu_type: str | None = None

    @property
    def replicas(self) -> int:
        return sum(g for _, g in self.placement)


def check_jobs(jobs: Sequence[JobInput]) -> None:
    """Refuse what no scheduler can decide on: a job listed twice, a gang of no GPUs."""
    seen: set[str] = set()
    for j in jobs:
        if j.job_id in seen:
            raise JobInputError(f"job {j.job_id!r} is listed twice")
        seen.add(j.job_id)
        if j.requested_replicas < 1:
            raise JobInputError(f"job {j.job_id!r} requests {j.requested_replicas} replicas")


class ChangeKind(StrEnum):
    """What a change does to a job, in the order changes are listed (and should be
    applied): what frees GPUs first, then what takes them."""

    SUSPEND = "suspend"  # replicas 0: preempted, progress kept
    SHRINK = "shrink"
    MOVE = "move"  # same replicas on other nodes (a restart)
    REBATCH = "rebatch"  # same placement, another batch: no restart
    GROW = "grow"
    ADMIT = "admit"  # a waiting or suspended job starts


#: A change's place in the listing: `sorted(changes, key=change_order)`.
_ORDER = {kind: i for i, kind in enumerate(ChangeKind)}


@dataclass(frozen=True, slots=True)
class JobChange:
    """A change to one job. `replicas` 0 means suspend (placement empty, no batch);
    otherwise the job runs `replicas` workers with one GPU each on `placement`, with
    `local_batch` samples per micro-step and `accumulation` micro-steps per optimizer
    step (global batch = replicas x local_batch x accumulation). `restart` is False only
    for a batch-only change, which a job applies in place."""

    job_id: str
    kind: ChangeKind
    replicas: int
    placement: Placement
    local_batch: int | None
    accumulation: int | None
    global_batch: int | None
    restart: bool
    reason: str


def change_order(change: JobChange) -> tuple[int, str]:
    """Suspends and shrinks first, grows and admissions last; ties by job id."""
    return (_ORDER[change.kind], change.job_id)


@dataclass(frozen=True, slots=True)
class JobHolding:
    """What a job holds after the round (whether or not it changed)."""

    job_id: str
    replicas: int
    placement: Placement
    batch: BatchChoice | None
    speedup: float


@dataclass(frozen=True, slots=True)
class Schedule:
    changes: tuple[JobChange, ...]  # changes only, suspend/shrink first, grow/admit last
    holdings: tuple[JobHolding, ...]  # every arrived job, by id
    objective: float  # the scheduler's own measure after the round
    objective_before: float  # the same, had nothing changed


def used_gpus(holdings: Iterable[JobHolding]) -> dict[str, int]:
    """GPUs taken per node by holdings (a check for callers and tests)."""
    used: dict[str, int] = {}
    for h in holdings:
        for name, g in h.placement:
            used[name] = used.get(name, 0) + g
    return used


#: (now, capacity, jobs, params) -> the round's schedule
ScheduleFn = Callable[[float, ClusterCapacity, Sequence[JobInput], Any], Schedule]


@dataclass(frozen=True, slots=True)
class SchedulerSpec:
    """A registered scheduler: its name, what it does, its parameters' model, itself."""

    name: str
    description: str
    params: type[Model]
    run: ScheduleFn

    def parse(self, raw: Mapping[str, object] | None) -> Model:
        """The scheduler's parameters from a settings document (pydantic errors for
        unknown or out-of-range fields)."""
        return self.params.model_validate(raw or {})


__all__ = [
    "CapacityError",
    "ChangeKind",
    "ClusterCapacity",
    "GroupQuota",
    "JobChange",
    "JobHolding",
    "JobInput",
    "JobInputError",
    "NodeCapacity",
    "Placement",
    "Schedule",
    "ScheduleFn",
    "SchedulerError",
    "SchedulerSpec",
    "UnknownScheduler",
    "change_order",
    "check_jobs",
    "used_gpus",
]
