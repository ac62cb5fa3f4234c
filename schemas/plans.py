"""What the brain decides (OptimizeRequest, OptimizePlan) and what the operator applies
(ScalePlan, ScaleResult). Names follow DLRover's ResourcePlan and ScalePlan.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import Field

from schemas.envelope import Model
from schemas.jobs import JobEvent, NodeRef


class NodeResource(Model):
    cpu: float = Field(default=0, ge=0, description="cores; 0 = unchanged")
    memory: int = Field(default=0, ge=0, description="bytes; 0 = unchanged")
    gpu_num: int = Field(default=0, ge=0)
    gpu_type: str = ""
    gpu_memory: int = Field(default=0, ge=0, description="bytes per GPU; 0 = unchanged")
    priority: str = ""


class NodeGroupResource(Model):
    """Replicas of one role, each with the same resources."""

    count: int = Field(default=0, ge=0, description="replicas; 0 = unchanged")
    node_resource: NodeResource = Field(default_factory=NodeResource)


class ResourcePlan(Model):
    node_group_resources: dict[str, NodeGroupResource] = Field(default_factory=dict)
    node_resources: dict[str, NodeResource] = Field(
        default_factory=dict, description="per node name"
    )
    training: dict[str, Any] = Field(
        default_factory=dict,
        description="training knobs such as local_batch_size and accumulation_steps",
    )

    def is_empty(self) -> bool:
        return not (self.node_group_resources or self.node_resources or self.training)


class OptimizeRequest(JobEvent):
    """Ask the brain for a plan: the stage, and optionally the optimizer to use."""

    topic: ClassVar[str] = "job.events"
    type: Literal["optimize.request"] = "optimize.request"
    stage: str = Field(min_length=1)
    optimizer: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)


class OptimizePlan(JobEvent):
    """What the brain wants for a job, and why."""

    topic: ClassVar[str] = "brain.plans"
    type: Literal["brain.plan"] = "brain.plan"
    plan_id: str = Field(min_length=1)
    stage: str
    optimizer: str
    reason: str
    resource: ResourcePlan
    caused_by: str | None = Field(default=None, description="event_id of the input")


class Node(NodeRef):
    resource: NodeResource = Field(default_factory=NodeResource)


class MigrateNode(Model):
    """Replace a node by one with new resources: the new one first, then the old removed."""

    node: NodeRef
    resource: NodeResource


class ScalePlan(JobEvent):
    """The concrete diff the operator applies, once per plan_id."""

    topic: ClassVar[str] = "scale.plans"
    type: Literal["scale.plan"] = "scale.plan"
    plan_id: str = Field(min_length=1)
    source_plan: str | None = Field(default=None, description="plan_id of the OptimizePlan")
    node_group_resources: dict[str, NodeGroupResource] = Field(default_factory=dict)
    launch_nodes: list[Node] = Field(default_factory=list)
    remove_nodes: list[NodeRef] = Field(default_factory=list)
    migrate_nodes: list[MigrateNode] = Field(default_factory=list)
    training: dict[str, Any] = Field(default_factory=dict)


class ScaleStatus(StrEnum):
    APPLIED = "applied"
    REJECTED = "rejected"
    FAILED = "failed"


class ScaleResult(JobEvent):
    topic: ClassVar[str] = "scale.results"
    type: Literal["scale.result"] = "scale.result"
    plan_id: str = Field(min_length=1)
    status: ScaleStatus
    reason: str = ""
    observed: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="per role: pending/running/succeeded/failed counts"
    )
