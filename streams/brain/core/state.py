"""A job as the brain sees it: the model every layer of the core reads.

The state is everything an optimizer may look at, so that optimizers stay pure functions of
it: the last runtime samples, per-node peaks, OOM history, the job's stage and resources,
what the user pinned and what the brain last decided. Its JSON is also the input of the
dry run (`dlrover-events optimize --state FILE.json`), so the fields are plain data.

The folds that keep it current are in `streams.brain.core.folds`, its fast JSON in
`streams.brain.core.state_json`; this module holds only the model and the views optimizers share.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationInfo, model_validator

from schemas.bounds import Bytes, Cpu, Gpus, NodeId, Replicas, Steps
from schemas.envelope import EnvName, Model
from schemas.jobs import JobMeta, OOMKind
from schemas.plans import OptimizePlan, ScalePlan
from streams.brain.core.samples import Sample

#: DLRover keeps this many runtime samples per job (one about every 15 s).
MAX_SAMPLES = 60

#: Samples a job spends in an initial stage before the brain moves it on, when the master
#: does not say so itself: enough for the initial optimizers to see a stable speed.
INITIAL_STAGE_SAMPLES = 5

WORKER = "worker"
PS = "ps"

Distribution = Literal["allreduce", "ps", "local", "custom"]


class Stage(StrEnum):
    CREATE = "create"
    PS_INITIAL = "ps-initial"
    WORKER_INITIAL = "worker-initial"
    RUNNING = "running"


def normalize_stage(raw: str, distribution: Distribution = "allreduce") -> Stage | None:
    """Accept the spellings masters actually send (DLRover's `job_stage_ps_initial`,
    `ps_initial`, ...) so that no stage the master sends goes unrouted; None when unknown.

    A bare `initial` means the PS stage for PS jobs and the worker stage for the others.
    Asked where a stage comes in (an optimize request, a state read from JSON): a job's
    state holds the Stage itself.
    """
    name = raw.strip().lower().replace("_", "-")
    name = name.removeprefix("job-stage-")
    if name == "initial":
        return Stage.PS_INITIAL if distribution == "ps" else Stage.WORKER_INITIAL
    try:
        return Stage(name)
    except ValueError:
        return None


class JobStatus(StrEnum):
    SUBMITTED = "submitted"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


#: Jobs that finished are not decided for any more: no plan can help them.
FINISHED = frozenset({JobStatus.COMPLETED, JobStatus.FAILED})


class NodeStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    OOM = "oom"
    FAILED = "failed"
    EXITED = "exited"
    REMOVED = "removed"


#: Nodes a plan may still act on (remove, migrate).
ALIVE = frozenset({NodeStatus.PENDING, NodeStatus.RUNNING, NodeStatus.OOM})


_M = TypeVar("_M", bound=BaseModel)
_setattr = object.__setattr__


def updated(model: _M, update: dict[str, Any]) -> _M:
    """`model.model_copy(update=update)`, the same copy (values, fields set, nothing
    validated) at a third of its cost: the folds copy a job's state once per event, and
    pydantic's copy (three `copy.copy` calls and a private-attribute check) cost a tenth
    of the brain's time per sample. A model with extra or private attributes (none in the
    brain's state) takes pydantic's own path."""
    if getattr(model, "__pydantic_private__", None) is not None or model.__pydantic_extra__:
        return model.model_copy(update=update)
    cls = type(model)
    copied = cls.__new__(cls)
    values = model.__dict__.copy()
    values.update(update)
    _setattr(copied, "__dict__", values)
    _setattr(copied, "__pydantic_extra__", model.__pydantic_extra__)
    _setattr(copied, "__pydantic_fields_set__", model.__pydantic_fields_set__.union(update))
    _setattr(copied, "__pydantic_private__", None)
    return copied


def node_key(role: str, node_id: int) -> str:
    """The name a node goes by in state dicts and in ResourcePlan.node_resources."""
    return f"{role}-{node_id}"


def parse_node_key(key: str) -> tuple[str, int] | None:
    role, sep, raw_id = key.rpartition("-")
    if not sep or not role or not raw_id.isdigit():
        return None
    return role, int(raw_id)


class NodeState(Model):
    """One node (pod) of the job and the resources it was launched with."""

    type: str = Field(min_length=1)
    id: NodeId
    status: NodeStatus = NodeStatus.PENDING
    cpu: Cpu = 0
    memory: Bytes = Field(default=0, description="bytes requested")
    gpu_num: Gpus = 0
    gpu_memory: Bytes = Field(default=0, description="bytes per GPU")
    relaunches: Steps = Field(default=0, description="relaunches with new resources")

    @property
    def key(self) -> str:
        return node_key(self.type, self.id)

    @property
    def alive(self) -> bool:
        return self.status in ALIVE


class NodePeak(Model):
    """The most a node has used since the brain first saw it (not only the last samples)."""

    type: str
    id: NodeId
    cpu: Cpu = 0
    memory: Bytes = 0
    gpu_memory: Bytes = 0


class OOMRecord(Model):
    event_id: str
    kind: OOMKind
    at: datetime
    memory: Bytes | None = None
    gpu_memory: Bytes | None = None
    #: set once a plan addressed this OOM, so it is never acted on twice.
    handled: bool = False


class RoleResources(Model):
    """What a role has now: replicas and the resources of each replica."""

    replicas: Replicas = 0
    min_replicas: Replicas | None = None
    max_replicas: Replicas | None = None
    cpu: Cpu = 0
    memory: Bytes = 0
    gpu_num: Gpus = 0
    gpu_memory: Bytes = Field(default=0, description="bytes per GPU")
    rendezvous_host: NodeId | None = Field(
        default=None,
        description="the node of the role that hosts the job's rendezvous (None: none does)",
    )


class Pinned(Model):
    """Values the user fixed for a role: they win over any plan."""

    replicas: Replicas | None = None
    cpu: Cpu | None = None
    memory: Bytes | None = None
    gpu_memory: Bytes | None = None


#: Validation context of a state a user wrote: a stage no brain knows is an error.
REFUSE_UNKNOWN_STAGE = MappingProxyType({"unknown_stage": "refuse"})

#: Fields of states written by earlier brains that no reader needs: their JSON still loads.
_RETIRED_FIELDS = ("config_errors", "last_plan_at")


class AwaitedTraining(Model):
    """Training knobs of a plan the operator accepted but only the job can apply: until
    the job confirms them (training.applied), the planner must not ask for them again."""

    plan_id: str = Field(min_length=1)
    training: dict[str, Any] = Field(default_factory=dict)


class RejectedPlan(Model):
    """The brain's last ScalePlan the platform rejected, and why. The planner does not ask
    for the same change again while the job is as it was: a refusal such as "it hosts the
    job's rendezvous" is given again for as long as nothing about the job changed, and
    asking every few samples only floods the topics (`streams.brain.core.folds` forgets it
    once the job changes)."""

    plan: ScalePlan
    reason: str = ""


#: Step-time profile points kept per job: one per configuration it ran at (Pollux keeps
#: every configuration; a job that tried more than this forgets its oldest ones).
MAX_PROFILE_POINTS = 48
#: Samples a profile point's mean step is taken over: a configuration's step is steady by
#: then, and folding every later sample into it would cost each one copies for nothing.
PROFILE_SAMPLES = 8


class BatchBounds(Model):
    """The batch limits a submission declared (`schemas.jobs.JobSubmitted`): what a
    cluster scheduler may choose the job's batch from. `init_batch` is the batch it was
    submitted with, kept apart from `JobState.batch_size` (which follows the samples)."""

    init_batch: Steps = Field(ge=1)
    #: the smallest batch it converges at (None: init_batch); an adaptive job's batch is
    #: chosen from [min_batch, max_batch], its efficiency measured against min_batch
    min_batch: Steps | None = None
    max_batch: Steps | None = None
    min_local: Steps | None = None
    max_local: Steps | None = None
    adaptive: bool = False


class ProfilePoint(Model):
    """The mean step of one configuration the job ran at: what its throughput model is
    fitted from (`streams.brain.core.schedulers.goodput.fit_perf_params`)."""

    nodes: int = Field(ge=1)
    replicas: int = Field(ge=1)
    local_batch: int = Field(ge=1)
    accumulation: int = Field(ge=1)
    count: int = Field(ge=1)
    step_time: float = Field(gt=0, description="seconds per optimizer step (mean)")
    sync_time: float = Field(ge=0, description="all-reduce seconds not hidden (mean)")
    memory: Bytes = Field(default=0, description="largest host memory one replica used")


class Share(Model):
    """What the env's cluster scheduler gave the job, as the brain planned it: the
    scheduler's next round starts from it (restart penalty, attained service)."""

    placement: dict[str, Gpus] = Field(default_factory=dict, description="node -> GPUs")
    local_batch: Steps | None = None
    accumulation: Steps = 1
    restarts: Steps = 0
    attained_gpu_s: float = Field(default=0.0, ge=0)
    #: the round its attained service was last counted at
    since: datetime | None = None
    #: the scale plan that made this share, until the platform answers it; if the
    #: platform refuses it the job still holds what it held: `before`
    plan_id: str | None = None
    before: Share | None = None

    @property
    def replicas(self) -> int:
        return sum(self.placement.values())

    def planned(self, plan_id: str, before: Share) -> Share:
        """This share as the outcome of `plan_id`, replacing `before` (kept one deep)."""
        held = before.model_copy(update={"plan_id": None, "before": None})
        return self.model_copy(update={"plan_id": plan_id, "before": held})

    def answered(self, plan_id: str, accepted: bool) -> Share:
        """The share once the platform answered `plan_id`: as planned if it took the
        plan on, what the job held before if it refused it."""
        if self.plan_id != plan_id:
            return self
        if not accepted and self.before is not None:
            return self.before
        return self.model_copy(update={"plan_id": None, "before": None})


class JobState(Model):
    """Everything the brain knows about one job.

    Its counts and sizes have the contract's bounds (`schemas.bounds`), which every fold
    of valid events keeps: a state file or checkpoint past them (10^30 replicas, a cpu of
    1e308) is refused when read, with the bound, instead of reaching an optimizer's
    arithmetic or the planner's loops."""

    env: EnvName
    job: JobMeta
    distribution: Distribution = "allreduce"
    application: str = ""
    batch_size: Steps | None = Field(default=None, ge=1, description="global batch size")
    config: dict[str, Any] = Field(default_factory=dict)
    stage: Stage = Stage.CREATE
    stage_samples: int = Field(default=0, ge=0, description="samples seen in this stage")
    status: JobStatus = JobStatus.SUBMITTED
    submitted_at: datetime | None = None
    completed_at: datetime | None = None
    total_steps: Steps | None = Field(default=None, ge=1)
    recv_op_count: Steps | None = None
    restart_count: Steps = Field(default=3, description="relaunches allowed per node")
    roles: dict[str, RoleResources] = Field(default_factory=dict)
    pinned: dict[str, Pinned] = Field(default_factory=dict)
    nodes: dict[str, NodeState] = Field(default_factory=dict)
    samples: list[Sample] = Field(default_factory=list)
    peaks: dict[str, NodePeak] = Field(default_factory=dict)
    ooms: dict[str, list[OOMRecord]] = Field(default_factory=dict, description="per node")
    training: dict[str, Any] = Field(
        default_factory=dict, description="local_batch_size, accumulation_steps as running"
    )
    last_plan: OptimizePlan | None = None
    last_running_plan_at: datetime | None = None
    last_ps_change_at: datetime | None = None
    pending_scale_plan: ScalePlan | None = None
    rejected: RejectedPlan | None = Field(
        default=None, description="the last plan the platform rejected, while the job is as it was"
    )
    awaiting_training: AwaitedTraining | None = Field(
        default=None, description="knobs an accepted plan asked for, not confirmed by the job"
    )
    last_event_id: str | None = None
    #: set when retention pruned the finished job (streams/brain/runtime/retention.py): what is
    #: left is who it was and when it ended, so that its late events stay ignored
    pruned_at: datetime | None = None
    #: what a cluster scheduler needs (none of it is read without one)
    batch_bounds: BatchBounds | None = None
    priority: int = Field(default=0, description="admission order, higher first")
    group: str | None = Field(default=None, description="whose GPU quota it draws on")
    kueue_queue: str | None = Field(
        default=None, description="Kueue's queue that admits it: the scheduler only resizes it"
    )
    profile: list[ProfilePoint] = Field(default_factory=list, max_length=MAX_PROFILE_POINTS)
    grad_stats: tuple[float, float] | None = Field(
        default=None, description="(grad_sqr, grad_var) of the latest sample that had them"
    )
    share: Share | None = None
    #: a lockstep env read the submission before the tick its simulated clock reaches it:
    #: the job exists for no decision until then (`streams.brain.core.processor`)
    awaiting_arrival: bool = False
    #: held by its owner (an experiment's trial paused at a rung, job.held): suspended,
    #: its GPUs free, and no cluster scheduler admits it until it is released. Left out
    #: of the JSON while false, so a state that never was is the same bytes as before.
    on_hold: bool = Field(default=False, exclude_if=lambda v: v is False)

    @model_validator(mode="before")
    @classmethod
    def _read_older_json(cls, data: Any, info: ValidationInfo) -> Any:
        """States as earlier brains wrote them (checkpoints, state files): a stage as the
        master spelled it (`job_stage_running`, a bare `initial`), and fields since
        retired.

        A stage no brain knows (an earlier brain kept whatever an optimize request named,
        and answered every decision with `unknown_stage`) is read as `create`, so that a
        checkpoint holding one still loads and the job walks the stages again; read with
        the context `REFUSE_UNKNOWN_STAGE` (a user's state file) it is refused, naming
        the known ones."""
        if not isinstance(data, dict):
            return data
        raw = data.get("stage")
        retired = [name for name in _RETIRED_FIELDS if name in data]
        if not retired and (raw is None or isinstance(raw, Stage)):
            return data
        data = {k: v for k, v in data.items() if k not in _RETIRED_FIELDS}
        if isinstance(raw, str) and not isinstance(raw, Stage):
            distribution = data.get("distribution", "allreduce")
            stage = normalize_stage(raw, distribution if distribution == "ps" else "allreduce")
            if stage is None and info.context == REFUSE_UNKNOWN_STAGE:
                known = ", ".join(s.value for s in Stage)
                raise ValueError(f"unknown stage {raw!r}; known: {known}")
            data["stage"] = Stage.CREATE if stage is None else stage
        return data

    # -- views optimizers share -------------------------------------------------------

    def role(self, name: str) -> RoleResources:
        found = self.roles.get(name)
        return found if found is not None else RoleResources()  # built only when missing

    def alive_nodes(self, role: str) -> list[NodeState]:
        return sorted(
            (n for n in self.nodes.values() if n.type == role and n.alive), key=lambda n: n.id
        )

    def unhandled_ooms(self, kind: OOMKind) -> dict[str, list[OOMRecord]]:
        found: dict[str, list[OOMRecord]] = {}
        for key, records in self.ooms.items():
            open_ = [r for r in records if r.kind == kind and not r.handled]
            if open_:
                found[key] = open_
        return found

    def oom_nodes(self) -> set[str]:
        """Nodes that ever ran out of host memory (for history-based OOM optimizers)."""
        return {
            key
            for key, records in self.ooms.items()
            if any(r.kind == OOMKind.HOST_MEMORY for r in records)
        }

    def current_training(self, key: str) -> Any:
        return self.training.get(key)


def gpus_claimed(state: JobState) -> int:
    """GPUs a job holds (running) or waits for (submitted): its replicas x GPUs.

    A waiting job's demand counts as taken: growing a running job into GPUs a queued job
    needs starves the queue (an A/B test on Pollux workload-6 doubled the mean queueing
    delay when only running jobs were counted).
    """
    if (
        state.status not in (JobStatus.RUNNING, JobStatus.SUBMITTED)
        or state.awaiting_arrival
        or state.on_hold
    ):
        return 0
    return sum(role.replicas * role.gpu_num for role in state.roles.values())
