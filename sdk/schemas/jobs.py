"""Job lifecycle, node events and runtime samples: what training jobs and the operator say.

Field names follow DLRover's models (JobMeta, Node, RuntimeInfo) where they exist.
"""

from __future__ import annotations

import itertools
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints, model_validator

from schemas.bounds import (
    INT64_MAX,
    MAX_NODES,
    MAX_ROLES,
    BatchSize,
    Bytes,
    Cpu,
    Document,
    Gpus,
    GradStat,
    Int64,
    Labels,
    NodeId,
    Rate,
    Replicas,
    Steps,
    Text,
)
from schemas.envelope import Event, Model

#: Whose GPU quota a job draws on: a team or a user (an env's brain.scheduler.quotas).
GroupName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")
]
#: A Kueue queue's name, as a Kubernetes label value carries it.
QueueName = Annotated[
    str,
    StringConstraints(
        min_length=1, max_length=253, pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
    ),
]


class JobMeta(Model):
    """Who a job is: the attributes configs and optimizers target."""

    uuid: Text = Field(min_length=1, max_length=256)
    name: Text = ""
    namespace: Text = "default"
    cluster: Text = ""
    user: Text = ""
    group: Text = ""
    scenario: Text = Field(default="", description="Jobs of one scenario share history")
    app: Text = ""
    labels: Labels = Field(default_factory=dict)


class JobEvent(Event):
    """A job-keyed event: the key is always the job's uuid."""

    topic: ClassVar[str] = "job.events"
    job: JobMeta

    @model_validator(mode="after")
    def _key_is_job(self) -> JobEvent:
        if self.key is None:
            self.key = self.job.uuid
        elif self.key != self.job.uuid:
            raise ValueError(f"key {self.key!r} must be the job's uuid {self.job.uuid!r}")
        return self


class RoleSpec(Model):
    """What a job asks for per role when submitted."""

    replicas: Replicas
    min_replicas: Replicas | None = None
    max_replicas: Replicas | None = None
    cpu: Cpu = 0
    memory: Bytes = Field(default=0, description="bytes")
    gpu_num: Gpus = 0
    rendezvous_host: NodeId | None = Field(
        default=None,
        description="the node (id) of this role that hosts the job's rendezvous (an elastic "
        "role's c10d store, where every node meets); none: no node of the role does. "
        "Where the platform cannot replace it (cluster.capacity's capabilities), the brain "
        "plans no migration or removal of it by name",
    )


class JobSubmitted(JobEvent):
    type: Literal["job.submitted"] = "job.submitted"
    roles: dict[Text, RoleSpec] = Field(default_factory=dict, max_length=MAX_ROLES)
    application: Text = Field(default="", description="Model/workload kind, e.g. cifar10")
    batch_size: int | None = Field(
        default=None, ge=1, le=INT64_MAX, description="global batch size"
    )
    distribution: Literal["allreduce", "ps", "local", "custom"] = "allreduce"
    config: Document = Field(default_factory=dict)
    # Batch limits: what a scheduler that re-chooses the batch per allocation (Pollux)
    # may choose from. ``batch_size`` above is the global batch the job starts with;
    # replicas are bounded per role (``min_replicas``/``max_replicas``).
    min_batch_size: BatchSize | None = Field(
        default=None,
        description="smallest global batch the training converges at, as tuned (Pollux's "
        "initial batch): an adaptive scheduler never goes below it (default: batch_size)",
    )
    max_batch_size: BatchSize | None = Field(
        default=None, description="largest global batch (samples per optimizer step)"
    )
    min_local_batch_size: BatchSize | None = Field(
        default=None, description="smallest batch one replica may process per micro-step"
    )
    max_local_batch_size: BatchSize | None = Field(
        default=None, description="largest batch one replica may process per micro-step"
    )
    adaptive_batch_size: bool = Field(
        default=False,
        description="whether plans may change the global batch within these limits "
        "(the training keeps converging at another batch, e.g. with AdaScale)",
    )
    # Sharing a cluster: what a cluster scheduler admits first, whose quota a job draws
    # on, and whether Kueue rather than the brain admits it (docs/schedulers.md).
    priority: int = Field(
        default=0,
        ge=-(2**31),
        le=2**31 - 1,
        description="admission order under a cluster scheduler, higher first (the range of "
        "a Kubernetes PriorityClass)",
    )
    group: GroupName | None = Field(
        default=None,
        description="the team or user whose GPU quota the job draws on "
        "(the env's brain.scheduler.quotas); none: it only borrows idle GPUs",
    )
    kueue_queue: QueueName | None = Field(
        default=None,
        description="the Kueue LocalQueue that admits the job (its kueue.x-k8s.io/queue-name "
        "label): Kueue admits and suspends it, a cluster scheduler only resizes it within "
        "the GPUs Kueue gave it",
    )

    @model_validator(mode="after")
    def _batch_limits_ordered(self) -> JobSubmitted:
        # A limit pair that contradicts itself leaves a scheduler nothing to choose:
        # refused at the contract, with both numbers, rather than guessed at later.
        named: list[tuple[str, int]] = [
            (name, value)
            for name, value in (
                ("min_batch_size", self.min_batch_size),
                ("batch_size", self.batch_size),
                ("max_batch_size", self.max_batch_size),
            )
            if value is not None
        ]
        for (low_name, low), (high_name, high) in itertools.pairwise(named):
            if low > high:
                raise ValueError(f"{low_name} {low} must be <= {high_name} {high}")
        small, large = self.min_local_batch_size, self.max_local_batch_size
        if small is not None and large is not None and small > large:
            raise ValueError(
                f"min_local_batch_size {small} must be <= max_local_batch_size {large}"
            )
        return self


class JobHeld(JobEvent):
    """The job was held by its owner (``held``: suspended, and no plan resumes it until
    it is released) or released to the queue, by plan ``plan_id``: an experiment's trial
    paused at a rung, or promoted. Published by the operator when it applied that plan,
    so a cluster scheduler frees the held job's GPUs in its view and never admits it
    while it is held."""

    type: Literal["job.held"] = "job.held"
    held: bool
    plan_id: Text = Field(min_length=1)
    reason: Text = Field(default="", max_length=1024)


class JobStarted(JobEvent):
    type: Literal["job.started"] = "job.started"


class JobCompleted(JobEvent):
    type: Literal["job.completed"] = "job.completed"


class JobFailed(JobEvent):
    type: Literal["job.failed"] = "job.failed"
    reason: Text = ""


class NodeRef(Model):
    """A node (pod) of a job, named as DLRover names them: a role (type) and an index (id)."""

    type: Text = Field(min_length=1, description="role: worker, ps, chief, evaluator, ...")
    id: NodeId
    name: Text = ""


class NodeEvent(JobEvent):
    node: NodeRef


class NodeStarted(NodeEvent):
    type: Literal["node.started"] = "node.started"


class NodeExited(NodeEvent):
    type: Literal["node.exited"] = "node.exited"
    exit_code: Int64 = 0


class NodeFailed(NodeEvent):
    type: Literal["node.failed"] = "node.failed"
    reason: Text = ""
    exit_code: Int64 | None = None


class OOMKind(StrEnum):
    HOST_MEMORY = "host_memory"
    GPU_MEMORY = "gpu_memory"


class NodeOOM(NodeEvent):
    """Out of memory: host memory (OOMKilled, exit 137) and GPU memory need different fixes."""

    type: Literal["node.oom"] = "node.oom"
    kind: OOMKind
    memory: Bytes | None = Field(default=None, description="bytes in use or requested")
    gpu_memory: Bytes | None = Field(default=None, description="bytes allocated on GPU")
    exit_code: Int64 | None = None


class NodeUsage(Model):
    """One node's resource use in a runtime sample."""

    type: Text = Field(min_length=1, description="role")
    id: NodeId
    cpu: Cpu = Field(default=0, description="cores used")
    memory: Bytes = Field(default=0, description="bytes used")
    gpu_util: float | None = Field(default=None, ge=0, le=1)
    gpu_memory: Bytes | None = Field(default=None, description="bytes used on GPU")
    step_time: Rate | None = Field(default=None, description="seconds per step")


def _unset(value: object) -> bool:
    return value is None


class RuntimeSample(JobEvent):
    """A training job's progress and resource use at one moment."""

    topic: ClassVar[str] = "job.metrics"
    type: Literal["job.runtime_sample"] = "job.runtime_sample"
    global_step: Steps
    speed: Rate = Field(default=0, description="global steps per second")
    samples_per_s: Rate = 0
    batch_size: int | None = Field(
        default=None, ge=1, le=INT64_MAX, description="global batch size"
    )
    local_batch_size: int | None = Field(default=None, ge=1, le=INT64_MAX)
    accumulation_steps: int = Field(default=1, ge=1, le=INT64_MAX)
    world_size: int | None = Field(
        default=None,
        ge=1,
        le=INT64_MAX,
        description="processes training together when it was taken",
    )
    nodes: list[NodeUsage] = Field(default_factory=list, max_length=MAX_NODES)
    # What jobs report for a cluster scheduler (issue 18). Left out of the JSON when
    # unset, so a sample without them is the same bytes as before they existed (and takes
    # the brain's fast read, which knows no field it was not built with).
    num_nodes: int | None = Field(
        default=None,
        exclude_if=_unset,
        ge=1,
        le=MAX_NODES,
        description="machines (pods, torchrun agents) the job's processes ran on",
    )
    # The gradient statistics Pollux's statistical efficiency needs, both or neither:
    # the mean of the estimates made in this sample's interval, each from the gradients
    # of several replicas (or micro-batches) against their average (AdaScale's estimator).
    grad_sqr: GradStat | None = Field(
        default=None, exclude_if=_unset, description="|E[g]|^2: squared norm of the true gradient"
    )
    grad_var: GradStat | None = Field(
        default=None,
        exclude_if=_unset,
        description="tr(Cov[g]) of ONE sample's gradient: a mean over B samples has "
        "variance grad_var / B; the gradient noise scale is grad_var / grad_sqr samples, "
        "and the statistical efficiency of global batch M against M0 is "
        "(grad_var + M0 * grad_sqr) / (grad_var + M * grad_sqr)",
    )
    # Where a step's time goes: the part a faster interconnect or fewer nodes would save.
    compute_s: Rate | None = Field(
        default=None,
        exclude_if=_unset,
        description="seconds per step computing (forward, backward, update)",
    )
    allreduce_s: Rate | None = Field(
        default=None,
        exclude_if=_unset,
        description="seconds per step synchronising gradients (all-reduce)",
    )

    @model_validator(mode="after")
    def _grad_stats_paired(self) -> RuntimeSample:
        # One without the other is no efficiency: a consumer never sees half of it.
        if (self.grad_sqr is None) != (self.grad_var is None):
            raise ValueError("grad_sqr and grad_var come together: give both or neither")
        return self
