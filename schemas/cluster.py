"""What a real env's cluster has for jobs: the platform's word on its hosts and their GPUs.

A cluster scheduler gives out GPUs; on a real platform it must give out what the cluster
has now, not a number from the settings. The operator of a real env publishes the whole
picture on ``<env>.cluster.capacity`` at its start and at every change (a Node added,
cordoned, NotReady or deleted; the local platform's slots). The topic is compacted and
every report is keyed alike, so a brain that starts reads the latest one and nothing older.
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


class CapacityReported(Event):
    """The cluster's hosts as the platform sees them now (the whole picture, not a diff)."""

    topic: ClassVar[str] = "cluster.capacity"
    type: Literal["cluster.capacity"] = "cluster.capacity"
    platform: Text = Field(min_length=1, max_length=64, description="kubernetes, local, ...")
    hosts: list[HostCapacity] = Field(default_factory=list, max_length=MAX_NODES)

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


__all__ = ["CAPACITY_KEY", "CapacityReported", "HostCapacity"]
