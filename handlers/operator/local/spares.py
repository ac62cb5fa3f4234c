"""Warm spares of the local platform's in-place elastic roles (pure decisions).

A cold scale-up costs a process's start: torch imported, the model built, a few seconds.
A role with ``elastic.spares: N`` (mode inPlace) has N processes started ahead, each the
role's own node command (its shim, its torchrun agent, its worker), which stop at
``wait_admitted`` with the model built. A new pod of the role takes one instead of a cold
start: the platform moves the spare's directory to the pod's (the shim and its processes
go on, and the shim writes its ending where its directory now is) and writes the
admission file with the pod's variables; the worker takes them on and joins the job's
group in place. Then a new spare is started.

A spare is made from a pod of the same role (its command, directory, memory), less what
only a pod knows: its rank, and whether it hosts the job's store. It is admitted only by a
pod whose node would run the same (a plan that changed the role's memory gets a cold
start), and never crosses jobs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlrover_events.sdk.identity import (
    ELASTIC_ADMIT_ENV,
    ELASTIC_STORE_HOST_ENV,
    RANK_ENV,
)
from handlers.operator.platform.bodies import FINAL_PHASES, JobView

#: Where spares live (a sibling of ``pods/``: a spare becomes a pod by a rename).
SPARES = "spares"
#: The admission files (outside a spare's directory, which moves when it is admitted).
ADMISSIONS = "admissions"
#: What a spare is for, in its directory.
SPARE = "spare.json"
#: Variables only a pod has: a spare learns them when it is admitted.
POD_ONLY = (RANK_ENV, ELASTIC_STORE_HOST_ENV)


@dataclass(frozen=True)
class SpareKey:
    """What a spare and a new pod must share for the spare to become that pod."""

    job_uid: str
    role: str
    command: tuple[str, ...]
    cwd: str
    memory: int | None

    @classmethod
    def of(cls, job_uid: str, role: str, shim_spec: Mapping[str, Any]) -> SpareKey:
        return cls(
            job_uid,
            role,
            tuple(shim_spec["command"]),
            str(shim_spec.get("cwd") or ""),
            shim_spec.get("memory"),
        )

    def as_record(self) -> dict[str, Any]:
        return {
            "job_uid": self.job_uid,
            "role": self.role,
            "command": list(self.command),
            "cwd": self.cwd,
            "memory": self.memory,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SpareKey:
        return cls(
            str(record["job_uid"]),
            str(record["role"]),
            tuple(record["command"]),
            str(record.get("cwd") or ""),
            record.get("memory"),
        )


def wanted(jobs: Iterable[JobView]) -> dict[tuple[str, str], int]:
    """(job uid, role) -> spares to keep: the in-place roles of the jobs still running."""
    out: dict[tuple[str, str], int] = {}
    for job in jobs:
        if job.phase in FINAL_PHASES:
            continue
        for name, role in job.roles.items():
            policy = role.elastic
            if policy is not None and policy.in_place and policy.spares > 0 and role.replicas:
                out[(job.uid, name)] = policy.spares
    return out


def spare_name(job: str, role: str) -> str:
    return f"{job}-{role}-spare-{uuid.uuid4().hex[:8]}"


def spare_spec(pod_spec: Mapping[str, Any], name: str, admit_file: Path) -> dict[str, Any]:
    """The shim spec of a spare made from a pod's: the same node command, less what only
    a pod has, waiting at ``admit_file``."""
    env = {k: v for k, v in pod_spec["env"].items() if k not in POD_ONLY}
    env[ELASTIC_ADMIT_ENV] = str(admit_file)
    return {**pod_spec, "name": name, "env": env}


def admission(pod: str, pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    """What an admitted spare takes on: the pod's name and its variables."""
    return {"pod": pod, "env": dict(pod_spec["env"])}


def take(spares: Mapping[str, SpareKey], key: SpareKey) -> str | None:
    """The spare a new pod with ``key`` takes (one started for the same), None when
    there is none."""
    return min((name for name, k in spares.items() if k == key), default=None)


__all__ = [
    "ADMISSIONS",
    "POD_ONLY",
    "SPARE",
    "SPARES",
    "SpareKey",
    "admission",
    "spare_name",
    "spare_spec",
    "take",
    "wanted",
]
