"""What a real env's cluster has for jobs: the platform's word on its hosts and their GPUs.

A cluster scheduler gives out GPUs; on a real platform it must give out what the cluster
has now, not a number from the settings. The operator of a real env publishes the whole
picture on ``<env>.cluster.capacity`` at its start and at every change (a Node added,
cordoned, NotReady or deleted; the local platform's slots). The topic is compacted and
every report is keyed alike, so a brain that starts reads the latest one and nothing older.

With the hosts goes what the platform can apply (``PlatformCapabilities``): a plan the
platform would reject costs a round trip, a red result and a job left as it was, so the
brain plans only what the platform says it can do (a node that cannot be replaced is not
migrated). A platform that does not count its hosts still says what it can do
(``hosts_counted`` false).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from schemas.bounds import MAX_NODES, Gpus, Text
from schemas.envelope import Event, Model

#: Every report has this key: compaction keeps the latest picture of the cluster.
CAPACITY_KEY = "capacity"


class HostCapacity(Model):
    """One machine pods run on (a Kubernetes Node; this machine on the local platform)."""

    name: Text = Field(min_length=1, max_length=253)
    gpus: Gpus = Field(description="GPUs (slots) it can give pods: a Node's allocatable")
    schedulable: bool = Field(
        default=True, description="false: cordoned, NotReady, or taking no new pods"
    )
    gpu_type: Text | None = Field(
        default=None, max_length=253, description="from the Node's GPU-type label, if any"
    )


class PlatformCapabilities(Model):
    """What the platform's jobs can be asked for: the platform's own declaration, which
    its operator's rules follow and the brain plans by."""

    gpu_types: bool = Field(
        default=False, description="a plan's GPU type is honoured (pods select GPU types)"
    )
    spares: bool = Field(
        default=False, description="warm spares of in-place elastic roles are kept"
    )
    suspend: bool = Field(
        default=False, description="a job can be suspended and resumed, its place kept"
    )
    migrates_nodes: bool = Field(
        default=True,
        description="a node can be given resources of its own (replaced by a new pod); "
        "false where another controller owns the pods (a PyTorchJob's training-operator)",
    )
    replaces_rendezvous_host: bool = Field(
        default=False,
        description="the node that hosts an elastic role's rendezvous (its c10d store) "
        "can be replaced or removed by name; false: a plan that migrates or names it is "
        "rejected, since every other node of the job meets there",
    )


class CapacityReported(Event):
    """The cluster's hosts as the platform sees them now (the whole picture, not a diff),
    and what the platform can apply."""

    topic: ClassVar[str] = "cluster.capacity"
    type: Literal["cluster.capacity"] = "cluster.capacity"
    platform: Text = Field(min_length=1, max_length=64, description="kubernetes, local, ...")
    hosts: list[HostCapacity] = Field(default_factory=list, max_length=MAX_NODES)
    hosts_counted: bool = Field(
        default=True,
        description="false: the platform does not count its hosts (the local platform "
        "without slots, Kubernetes without its Node report): `hosts` says nothing, and a "
        "scheduler keeps its settings' cluster",
    )
    capabilities: PlatformCapabilities | None = Field(
        default=None,
        description="what the platform can apply (none: not said, by an operator older "
        "than the field: the brain plans as if it could apply anything)",
    )

    @model_validator(mode="after")
    def _one_key(self) -> CapacityReported:
        names = [h.name for h in self.hosts]
        if len(set(names)) != len(names):
            raise ValueError("hosts: a host is named twice")
        self.key = CAPACITY_KEY
        return self

    @property
    def gpus(self) -> int:
        """GPUs a scheduler may hand out: those of schedulable hosts."""
        return sum(h.gpus for h in self.hosts if h.schedulable)


__all__ = ["CAPACITY_KEY", "CapacityReported", "HostCapacity", "PlatformCapabilities"]
