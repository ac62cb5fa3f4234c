"""The virtual operator's knobs: the env's `operator` settings (the schema is
`schemas.env_settings.OperatorSettings`), over DLROVER_EVENTS_OPERATOR_* variables.

Command-line options override both; the defaults are the cluster the Pollux workloads were
measured against (16 nodes x 4 GPUs) and the sample rate a DLRover job reports at.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from dlrover_events.errors import UserError
from handlers.simulator.cluster import Cluster, GiB
from schemas.env_settings import OperatorSettings


class VirtualSettings(OperatorSettings, BaseSettings):
    """The env's `operator` settings (`schemas.env_settings.OperatorSettings`, where the
    fields are), read from DLROVER_EVENTS_OPERATOR_* too."""

    model_config = SettingsConfigDict(env_prefix="DLROVER_EVENTS_OPERATOR_", extra="ignore")

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
