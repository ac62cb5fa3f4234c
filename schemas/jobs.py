"""Job lifecycle, node events and runtime samples: what training jobs and the operator say.

Field names follow DLRover's models (JobMeta, Node, RuntimeInfo) where they exist.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from schemas.envelope import Event, Model


class JobMeta(Model):
    """Who a job is: the attributes configs and optimizers target."""

    uuid: str = Field(min_length=1, max_length=256)
    name: str = ""
    namespace: str = "default"
    cluster: str = ""
    user: str = ""
    group: str = ""
    scenario: str = Field(default="", description="Jobs of one scenario share history")
    app: str = ""
    labels: dict[str, str] = Field(default_factory=dict)


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

    replicas: int = Field(ge=0)
    min_replicas: int | None = Field(default=None, ge=0)
    max_replicas: int | None = Field(default=None, ge=0)
    cpu: float = Field(default=0, ge=0)
    memory: int = Field(default=0, ge=0, description="bytes")
    gpu_num: int = Field(default=0, ge=0)


class JobSubmitted(JobEvent):
    type: Literal["job.submitted"] = "job.submitted"
    roles: dict[str, RoleSpec] = Field(default_factory=dict)
    application: str = Field(default="", description="Model/workload kind, e.g. cifar10")
    batch_size: int | None = Field(default=None, ge=1, description="global batch size")
    distribution: Literal["allreduce", "ps", "local", "custom"] = "allreduce"
    config: dict[str, Any] = Field(default_factory=dict)


class JobStarted(JobEvent):
    type: Literal["job.started"] = "job.started"


class JobCompleted(JobEvent):
    type: Literal["job.completed"] = "job.completed"


class JobFailed(JobEvent):
    type: Literal["job.failed"] = "job.failed"
    reason: str = ""


class NodeRef(Model):
    """A node (pod) of a job, named as DLRover names them: a role (type) and an index (id)."""

    type: str = Field(min_length=1, description="role: worker, ps, chief, evaluator, ...")
    id: int = Field(ge=0)
    name: str = ""


class NodeEvent(JobEvent):
    node: NodeRef


class NodeStarted(NodeEvent):
    type: Literal["node.started"] = "node.started"


class NodeExited(NodeEvent):
    type: Literal["node.exited"] = "node.exited"
    exit_code: int = 0


class NodeFailed(NodeEvent):
    type: Literal["node.failed"] = "node.failed"
    reason: str = ""
    exit_code: int | None = None


class OOMKind(StrEnum):
    HOST_MEMORY = "host_memory"
    GPU_MEMORY = "gpu_memory"


class NodeOOM(NodeEvent):
    """Out of memory: host memory (OOMKilled, exit 137) and GPU memory need different fixes."""

    type: Literal["node.oom"] = "node.oom"
    kind: OOMKind
    memory: int | None = Field(default=None, ge=0, description="bytes in use or requested")
    gpu_memory: int | None = Field(default=None, ge=0, description="bytes allocated on GPU")
    exit_code: int | None = None


class NodeUsage(Model):
    """One node's resource use in a runtime sample."""

    type: str = Field(min_length=1, description="role")
    id: int = Field(ge=0)
    cpu: float = Field(default=0, ge=0, description="cores used")
    memory: int = Field(default=0, ge=0, description="bytes used")
    gpu_util: float | None = Field(default=None, ge=0, le=1)
    gpu_memory: int | None = Field(default=None, ge=0, description="bytes used on GPU")
    step_time: float | None = Field(default=None, ge=0, description="seconds per step")


class RuntimeSample(JobEvent):
    """A training job's progress and resource use at one moment."""

    topic: ClassVar[str] = "job.metrics"
    type: Literal["job.runtime_sample"] = "job.runtime_sample"
    global_step: int = Field(ge=0)
    speed: float = Field(default=0, ge=0, description="global steps per second")
    samples_per_s: float = Field(default=0, ge=0)
    batch_size: int | None = Field(default=None, ge=1, description="global batch size")
    local_batch_size: int | None = Field(default=None, ge=1)
    accumulation_steps: int = Field(default=1, ge=1)
    world_size: int | None = Field(
        default=None, ge=1, description="processes training together when it was taken"
    )
    nodes: list[NodeUsage] = Field(default_factory=list)
