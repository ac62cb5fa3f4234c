"""The virtual operator's knobs (DLROVER_EVENTS_OPERATOR_*), beside the shared Settings.

Command-line options override them; the defaults are the cluster the Pollux workloads were
measured against (16 nodes x 4 GPUs) and the sample rate a DLRover job reports at.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from dlrover_events.errors import UserError
from handlers.simulator.cluster import Cluster, GiB
from handlers.simulator.job import DEFAULT_RESTART_DELAY


class VirtualSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DLROVER_EVENTS_OPERATOR_", extra="ignore")

    nodes: int = Field(default=16, ge=1, description="nodes of the simulated cluster")
    gpus_per_node: int = Field(default=4, ge=0)
    cpu_per_node: float = Field(default=64.0, gt=0, description="cores")
    memory_per_node_gib: float = Field(default=256.0, gt=0)
    speed: float = Field(
        default=1.0, gt=0, description="simulated seconds per wall second (ignored when fast)"
    )
    fast: bool = Field(default=False, description="jump from event to event as fast as possible")
    lockstep: bool = Field(
        default=False,
        description="move the clock a tick at a time, each tick once the brain has decided it "
        "(barriers out, acknowledgements in); speed and fast are then ignored",
    )
    tick_s: float | None = Field(
        default=None,
        gt=0,
        description="simulated seconds per lockstep tick (default: sample_interval)",
    )
    sample_interval: float = Field(
        default=30.0, gt=0, description="simulated seconds between a job's runtime samples"
    )
    restart_delay: float = Field(
        default=DEFAULT_RESTART_DELAY, ge=0, description="simulated checkpoint-restart seconds"
    )
    admission: Literal["cluster", "brain"] = Field(
        default="cluster",
        description="who starts a submitted job: the simulated cluster as soon as its gang "
        "fits (cluster), or only a plan that gives it replicas (brain: a cluster scheduler "
        "in the brain owns admission)",
    )
    max_sleep: float = Field(
        default=0.5, gt=0, description="wall seconds the clock waits at most between looks"
    )

    @property
    def tick_seconds(self) -> float:
        """A tick of one sample interval: every running job says something in each tick,
        and a plan lands at most one sample later than the sample that caused it."""
        return self.tick_s if self.tick_s is not None else self.sample_interval

    def cluster(self) -> Cluster:
        return Cluster(
            self.nodes,
            self.gpus_per_node,
            cpu_per_node=self.cpu_per_node,
            memory_per_node=int(self.memory_per_node_gib * GiB),
        )


def virtual_settings(overrides: Mapping[str, Any]) -> VirtualSettings:
    """Environment settings with the given options on top; a bad value is the user's to fix."""
    cluster_only = sorted(set(overrides) & {"kubeconfig", "namespace", "follow_real"})
    if cluster_only:
        raise UserError(
            f"{', '.join(cluster_only)} apply to the real env's operator; a virtual env's "
            "operator simulates its cluster and holds no cluster credentials"
        )
    unknown = sorted(set(overrides) - set(VirtualSettings.model_fields))
    if unknown:
        raise UserError(f"unknown virtual operator option(s): {', '.join(unknown)}")
    try:
        return VirtualSettings(**overrides)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(f"virtual operator option {where}: {first['msg']}") from None
