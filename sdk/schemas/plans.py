"""What the brain decides (OptimizeRequest, OptimizePlan) and what the operator applies
(ScalePlan, ScaleResult). Names follow DLRover's ResourcePlan and ScalePlan.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from schemas.bounds import (
    MAX_NODES,
    MAX_ROLES,
    Bytes,
    Cpu,
    Document,
    Gpus,
    Int64,
    Rate,
    Replicas,
    Steps,
    Text,
)
from schemas.envelope import Model
from schemas.jobs import JobEvent, JobMeta, NodeRef


class NodeResource(Model):
    cpu: Cpu = Field(default=0, description="cores; 0 = unchanged")
    memory: Bytes = Field(default=0, description="bytes; 0 = unchanged")
    gpu_num: Gpus = 0
    gpu_type: Text = ""
    gpu_memory: Bytes = Field(default=0, description="bytes per GPU; 0 = unchanged")
    priority: Text = ""


class NodeGroupResource(Model):
    """Replicas of one role, each with the same resources."""

    count: Replicas = Field(default=0, description="replicas; 0 = unchanged")
    node_resource: NodeResource = Field(default_factory=NodeResource)


class ResourcePlan(Model):
    node_group_resources: dict[Text, NodeGroupResource] = Field(
        default_factory=dict, max_length=MAX_ROLES
    )
    node_resources: dict[Text, NodeResource] = Field(
        default_factory=dict, max_length=MAX_NODES, description="per node name"
    )
    training: Document = Field(
        default_factory=dict,
        description="training knobs such as local_batch_size and accumulation_steps",
    )

    def is_empty(self) -> bool:
        return not (self.node_group_resources or self.node_resources or self.training)


class OptimizeRequest(JobEvent):
    """Ask the brain for a plan: the stage, and optionally the optimizer to use."""

    topic: ClassVar[str] = "job.events"
    type: Literal["optimize.request"] = "optimize.request"
    stage: Text = Field(min_length=1)
    optimizer: Text | None = None
    config: Document = Field(default_factory=dict)


class OptimizePlan(JobEvent):
    """What the brain wants for a job, and why."""

    topic: ClassVar[str] = "brain.plans"
    type: Literal["brain.plan"] = "brain.plan"
    plan_id: Text = Field(min_length=1)
    stage: Text
    optimizer: Text
    reason: Text
    resource: ResourcePlan
    caused_by: Text | None = Field(default=None, description="event_id of the input")


class Node(NodeRef):
    resource: NodeResource = Field(default_factory=NodeResource)


class MigrateNode(Model):
    """Replace a node by one with new resources: the new one first, then the old removed."""

    node: NodeRef
    resource: NodeResource


def _empty(value: object) -> bool:
    return not value


def _false(value: object) -> bool:
    return value is False


def _none(value: object) -> bool:
    return value is None


class ScalePlan(JobEvent):
    """The concrete diff the operator applies, once per plan_id."""

    topic: ClassVar[str] = "scale.plans"
    type: Literal["scale.plan"] = "scale.plan"
    plan_id: Text = Field(min_length=1)
    source_plan: Text | None = Field(default=None, description="plan_id of the OptimizePlan")
    node_group_resources: dict[Text, NodeGroupResource] = Field(
        default_factory=dict, max_length=MAX_ROLES
    )
    launch_nodes: list[Node] = Field(default_factory=list, max_length=MAX_NODES)
    remove_nodes: list[NodeRef] = Field(default_factory=list, max_length=MAX_NODES)
    migrate_nodes: list[MigrateNode] = Field(default_factory=list, max_length=MAX_NODES)
    training: Document = Field(default_factory=dict)
    # What a cluster scheduler (streams.brain.core.schedulers) decides beyond counts. Left out
    # of the JSON when unset, so a plan without them is the same bytes as before.
    placement: dict[Text, Gpus] = Field(
        default_factory=dict,
        max_length=MAX_NODES,
        exclude_if=_empty,
        description="cluster node name -> GPUs of the job's training replicas there, as the "
        "scheduler placed them (whole nodes for a multi-node job); a platform that cannot "
        "pin pods to nodes lists it not applied",
    )
    suspend: bool = Field(
        default=False,
        exclude_if=_false,
        description="preempt: stop every training replica and free its GPUs, progress "
        "kept (checkpoint); a later plan with a count resumes the job",
    )
    hold: bool | None = Field(
        default=None,
        exclude_if=_none,
        description="true (with suspend): the job is held by its owner (an experiment's "
        "searcher pausing a trial at a rung): suspended, and no plan resumes it, a cluster "
        "scheduler's included, until a plan with hold false releases it; false: release "
        "a held job to the queue (a cluster scheduler admits it when it has room; without "
        "one the operator resumes it)",
    )

    @model_validator(mode="after")
    def _suspend_is_alone(self) -> ScalePlan:
        # A suspend that also resized or placed the job would say two things at once.
        if self.suspend and (self.placement or self.launch_nodes or self.migrate_nodes):
            raise ValueError("a suspend plan places, launches and migrates nothing")
        if self.hold is True and not self.suspend:
            raise ValueError("a plan that holds a job suspends it (suspend: true)")
        if self.hold is False and (self.suspend or self.placement or self.launch_nodes):
            raise ValueError("a plan that releases a held job only releases it")
        return self


class ScaleStatus(StrEnum):
    """What became of a plan. ``applied`` only when every part of it was; ``partial`` when
    the platform applied some parts and lists the others in ``not_applied`` (training knobs
    await the job's own confirmation, a GPU type the platform cannot express, ...)."""

    APPLIED = "applied"
    PARTIAL = "partial"
    REJECTED = "rejected"
    FAILED = "failed"


#: Parts of a plan a result may list as not applied: bounded, a result is one message.
MAX_NOT_APPLIED = 64


class NotApplied(Model):
    """One part of a plan the platform did not apply, and why.

    ``part`` names it as the plan does: ``training.local_batch_size``,
    ``worker.gpu_type``, ``worker-2.gpu_memory``, ...
    """

    part: Text = Field(min_length=1, max_length=256)
    reason: Text = Field(min_length=1, max_length=1024)


class RescaleMode(StrEnum):
    """How a job's training processes take a new world size.

    ``restart``: every worker process is stopped and started again (torchrun's agents
    re-rendezvous) and resumes from its checkpoint. ``in_place``: the processes go on;
    at one step boundary they agree on the new membership and re-form their process
    group, and newcomers receive the state from a surviving rank (the SDK's
    ``dlrover_events.sdk.torch.inplace``).
    """

    IN_PLACE = "in_place"
    RESTART = "restart"


class ScaleResult(JobEvent):
    topic: ClassVar[str] = "scale.results"
    type: Literal["scale.result"] = "scale.result"
    plan_id: Text = Field(min_length=1)
    status: ScaleStatus
    reason: Text = ""
    rescale_mode: RescaleMode | None = Field(
        default=None,
        exclude_if=_none,
        description="how the job's processes take the new world size, for a plan that "
        "resized an elastic role (its phases come from the job: training.rescaled)",
    )
    observed: dict[Text, dict[Text, Int64]] = Field(
        default_factory=dict,
        max_length=MAX_ROLES,
        description="per role: pending/running/succeeded/failed counts",
    )
    not_applied: list[NotApplied] = Field(
        default_factory=list,
        max_length=MAX_NOT_APPLIED,
        description="the parts of the plan not applied (status partial), each with why",
    )

    @model_validator(mode="after")
    def _partial_names_its_parts(self) -> ScaleResult:
        if self.status == ScaleStatus.PARTIAL and not self.not_applied:
            raise ValueError("a partial result must list the parts it did not apply")
        if self.status == ScaleStatus.APPLIED and self.not_applied:
            raise ValueError("an applied result applied every part: use status partial")
        return self


#: Training knobs a plan may carry and a job applies itself, at a step boundary.
TRAINING_KNOBS = ("local_batch_size", "accumulation_steps")


class TrainingApplied(JobEvent):
    """The job's own word that it now trains with a plan's knobs.

    Only the training process can change its micro-batch: the operator reports such a
    plan ``partial``, and the brain takes the knobs as in force only from this event.
    """

    topic: ClassVar[str] = "job.events"
    type: Literal["training.applied"] = "training.applied"
    plan_id: Text = Field(min_length=1, max_length=256)
    node: NodeRef = Field(description="the process that applied them (rank 0 speaks for all)")
    training: dict[Text, Int64] = Field(
        max_length=16, description="the knobs now in force, e.g. local_batch_size"
    )
    global_step: Steps = Field(description="the first step trained with them")


class RescalePhases(Model):
    """Where the seconds of one rescale went, each measured by the job (None: not
    measured in this mode). In place: ``plan_delivery`` (the plan's publication to the
    job's first sign of it: a leaving process told to stop, a newcomer registered),
    ``agreement`` (that sign to every rank agreeing on the new membership, the wait for
    the step boundary included), ``reform`` (the process group destroyed and created
    again, DDP rebuilt), ``state_transfer`` (newcomers receiving the model and optimizer
    state by broadcast), ``first_step`` (the first step at the new size). Restart:
    ``reform`` is a new process's start to its process group (importing torch and the
    rendezvous), ``state_transfer`` the checkpoint's load."""

    plan_delivery_s: Rate | None = None
    agreement_s: Rate | None = None
    reform_s: Rate | None = None
    state_transfer_s: Rate | None = None
    first_step_s: Rate | None = None
    total_s: Rate | None = Field(
        default=None,
        description="the plan's publication (else the first sign) to the end of the "
        "first step at the new size",
    )


class TrainingRescaled(JobEvent):
    """The job's own word that it trains at a new world size, how it got there and what
    it cost (rank 0 speaks for all, after the first step at the new size)."""

    topic: ClassVar[str] = "job.events"
    type: Literal["training.rescaled"] = "training.rescaled"
    mode: RescaleMode
    plan_id: Text | None = Field(
        default=None, max_length=256, description="the plan that asked for it, when known"
    )
    node: NodeRef = Field(description="the process that reports (rank 0 of the new world)")
    world_size_before: Replicas | None = None
    world_size: Replicas
    global_step: Steps = Field(description="the first step trained at the new size")
    steps_lost: Steps | None = Field(
        default=None,
        description="completed steps trained again after it (None: not known, as after a "
        "restart that resumed from a checkpoint the new processes cannot compare)",
    )
    reason: Text = Field(
        default="",
        max_length=1024,
        description="why: a plan, a peer lost, a restart after in-place re-forming failed",
    )
    phases: RescalePhases = Field(default_factory=RescalePhases)


class JobPlan(Model):
    """A job's latest plan as the gateway serves it (``GET /v1/jobs/{job}/plan``).

    What a training process needs to follow its plans without reading the bus: the
    brain's latest OptimizePlan and ScalePlan for the job, the operator's answer to that
    ScalePlan once it came, and the job's own latest confirmation of training knobs.
    A job applies a ScalePlan's ``training`` knobs only once ``result`` accepted the plan
    (applied or partial) and confirms them with a TrainingApplied.
    """

    job: JobMeta
    optimize_plan: OptimizePlan | None = None
    scale_plan: ScalePlan | None = None
    result: ScaleResult | None = Field(
        default=None, description="the operator's answer to scale_plan, once it came"
    )
    training_applied: TrainingApplied | None = Field(
        default=None, description="the job's latest confirmation of training knobs"
    )

    def knobs_to_apply(self) -> tuple[str, dict[str, int]] | None:
        """(plan_id, knobs) the job should switch to now, None when there is nothing new:
        an accepted plan with training knobs the job has not confirmed yet."""
        plan, result = self.scale_plan, self.result
        if plan is None or not plan.training or result is None:
            return None
        if result.plan_id != plan.plan_id or result.status not in (
            ScaleStatus.APPLIED,
            ScaleStatus.PARTIAL,
        ):
            return None
        if self.training_applied is not None and self.training_applied.plan_id == plan.plan_id:
            return None
        knobs = {k: int(v) for k, v in plan.training.items() if k in TRAINING_KNOBS}
        return (plan.plan_id, knobs) if knobs else None
