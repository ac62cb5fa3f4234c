"""Job lifecycle, node events and runtime samples: what training jobs and the operator say.

Field names follow DLRover's models (JobMeta, Node, RuntimeInfo) where they exist.
"""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from schemas.bounds import (
    INT64_MAX,
    MAX_NODES,
    MAX_ROLES,
    Bytes,
    Cpu,
    Document,
    Gpus,
    Int64,
    Labels,
    NodeId,
    Rate,
    Replicas,
    Steps,
    Text,
)
from schemas.envelope import Event, Model


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


class JobSubmitted(JobEvent):
    type: Literal["job.submitted"] = "job.submitted"
    roles: dict[Text, RoleSpec] = Field(default_factory=dict, max_length=MAX_ROLES)
    application: Text = Field(default="", description="Model/workload kind, e.g. cifar10")
    batch_size: int | None = Field(
        default=None, ge=1, le=INT64_MAX, description="global batch size"
    )
    distribution: Literal["allreduce", "ps", "local", "custom"] = "allreduce"
    config: Document = Field(default_factory=dict)


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
