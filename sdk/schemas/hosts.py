"""Plain hosts and their agents (issue 35): what a host's agent says of itself and what the
hosts platform's operator asks of it, on two compacted topics keyed by host name.

A host's agent (`dlrover-events agent`) publishes a ``HostReported`` on
``<env>.hosts.reports`` every heartbeat and at every change: its slots (GPUs, or
artificial ones on a CPU-only host), the address the training processes of other hosts
reach it at, and the state of every pod it runs. Each report is the whole picture, not a
diff, so the operator needs only the latest one per host; the operator declares a host
lost when its reports stop (it times them itself, on its own clock).

The operator publishes a ``HostOrders`` on ``<env>.hosts.orders`` for a host whenever what
it wants of that host changes: every pod the host should run or stop, with what it runs
(its command, variables, directory, slots, grace period). Again the whole picture: the
latest orders of a host are all an agent (a restarted one too) needs, and a pod not in
them is none of the host's any more.
"""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from schemas.bounds import MAX_GPUS, MAX_LABEL_CHARS, Bytes, Text
from schemas.envelope import Event, Model

#: A host's name: a DNS name (what `hostname` says), as a Kubernetes Node is named.
HOST_NAME_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,251}[A-Za-z0-9])?$"
_HOST_NAME = re.compile(HOST_NAME_PATTERN)
#: Pods one host runs at most (a report or an orders event beyond it is refused).
MAX_HOST_PODS = 1_024
#: What a pod's command may hold: arguments, and variables.
MAX_ARGS = 4_096
MAX_VARIABLES = 1_024

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed"]


def check_host_name(name: str) -> str:
    if not _HOST_NAME.match(name):
        raise ValueError(
            f"host name {name!r} must be a DNS name: letters, digits, '-', '_' and '.', "
            "at most 253 characters, starting and ending with a letter or digit"
        )
    return name


class Slot(Model):
    """One thing a pod can be given on the host: a GPU (as nvidia-smi lists it) or an
    artificial slot of a CPU-only host (``index`` only)."""

    index: int = Field(ge=0, lt=MAX_GPUS, description="nvidia-smi's index: CUDA_VISIBLE_DEVICES")
    name: Text | None = Field(default=None, max_length=256, description="the GPU's product")
    uuid: Text | None = Field(default=None, max_length=256)
    memory: Bytes | None = Field(default=None, description="the GPU's memory, bytes")


class AgentPod(Model):
    """A pod as its host's agent sees it now."""

    name: Text = Field(min_length=1, max_length=253)
    uid: Text | None = Field(
        default=None,
        max_length=64,
        description="the uid it was ordered with (a name reused is another pod)",
    )
    phase: PodPhase
    pid: int | None = Field(default=None, ge=1, description="its shim's process id")
    exit_code: int | None = Field(default=None, ge=-255, le=255)
    #: why it ended (Completed, Error, Terminated, OOMKilled); OOMKilled on a running pod:
    #: one of its processes was killed for its memory limit and the pod goes on
    reason: Text = Field(default="", max_length=256)
    oom_kills: int = Field(default=0, ge=0)


class HostReported(Event):
    """A host's agent's word on itself: its slots, its address and its pods (the whole
    picture), every heartbeat and at every change."""

    topic: ClassVar[str] = "hosts.reports"
    type: Literal["host.reported"] = "host.reported"
    host: Text = Field(description="the host's name, unique among the env's agents")
    agent_id: Text = Field(
        min_length=1,
        max_length=64,
        description="this run of the agent (a restarted agent has a new one): two agents "
        "reporting under one host name are told apart by it",
    )
    address: Text = Field(
        min_length=1,
        max_length=253,
        description="where other hosts reach this one (a rendezvous it hosts listens here)",
    )
    slots: list[Slot] = Field(default_factory=list, max_length=MAX_GPUS)
    artificial: bool = Field(
        default=False, description="slots set by its settings (a CPU-only host), not GPUs"
    )
    pods: list[AgentPod] = Field(default_factory=list, max_length=MAX_HOST_PODS)
    heartbeat_s: float = Field(
        default=1.0, gt=0, le=60, description="how often it reports when nothing changes"
    )

    _check_host = field_validator("host")(check_host_name)

    @model_validator(mode="after")
    def _keyed(self) -> HostReported:
        indexes = [s.index for s in self.slots]
        if len(set(indexes)) != len(indexes):
            raise ValueError("slots: an index is listed twice")
        names = [p.name for p in self.pods]
        if len(set(names)) != len(names):
            raise ValueError("pods: a pod is listed twice")
        self.key = self.host
        return self


class OrderedPod(Model):
    """A pod a host should run (or stop: ``deleting``), with everything it runs."""

    name: Text = Field(min_length=1, max_length=253)
    uid: Text | None = Field(
        default=None,
        max_length=64,
        description="this pod, not an earlier one of its name (which its host removes first)",
    )
    command: list[Text] = Field(min_length=1, max_length=MAX_ARGS)
    variables: dict[Text, Text] = Field(default_factory=dict, max_length=MAX_VARIABLES)
    cwd: Text | None = Field(default=None, max_length=MAX_LABEL_CHARS)
    slots: list[int] = Field(
        default_factory=list, max_length=MAX_GPUS, description="the slot indexes it is given"
    )
    memory: Bytes | None = Field(default=None, description="its memory limit (None: none)")
    grace_s: float = Field(default=30.0, ge=0, le=86_400)
    deleting: bool = Field(default=False, description="stop it: SIGTERM, then the grace period")


class HostOrders(Event):
    """What the operator wants of one host now: the whole picture."""

    topic: ClassVar[str] = "hosts.orders"
    type: Literal["host.orders"] = "host.orders"
    host: Text
    pods: list[OrderedPod] = Field(default_factory=list, max_length=MAX_HOST_PODS)

    _check_host = field_validator("host")(check_host_name)

    @model_validator(mode="after")
    def _keyed(self) -> HostOrders:
        names = [p.name for p in self.pods]
        if len(set(names)) != len(names):
            raise ValueError("pods: a pod is ordered twice")
        self.key = self.host
        return self


__all__ = [
    "HOST_NAME_PATTERN",
    "AgentPod",
    "HostOrders",
    "HostReported",
    "OrderedPod",
    "Slot",
    "check_host_name",
]
