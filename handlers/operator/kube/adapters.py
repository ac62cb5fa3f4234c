"""The workload kinds the Kubernetes operator runs, by kind (the house's registry style:
dlrover_events.registry). Add a kind here, and its verbs to deploy/rbac/operator.yaml."""

from __future__ import annotations

from dlrover_events.errors import UserError
from dlrover_events.registry import Registry, UnknownName
from handlers.operator.kube.adapter import WorkloadAdapter
from handlers.operator.kube.pytorchjob import PYTORCH_JOB
from handlers.operator.kube.trainingjob import TRAINING_JOB


class UnknownWorkload(UserError, UnknownName):
    """A kind no adapter is registered for (DLROVER_EVENTS_OPERATOR_WORKLOAD)."""


ADAPTERS: Registry[WorkloadAdapter] = Registry.of(
    "workload kind", TRAINING_JOB, PYTORCH_JOB, unknown=UnknownWorkload
)


def adapter_for(kind: str) -> WorkloadAdapter:
    """The adapter of ``kind``; an UnknownWorkload naming the kinds the operator runs."""
    return ADAPTERS[kind]


__all__ = ["ADAPTERS", "UnknownWorkload", "adapter_for"]
