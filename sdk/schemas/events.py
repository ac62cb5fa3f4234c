"""The registry of event types: one discriminated union decodes any of them."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from schemas.checkpoints import CheckpointCommitted, CheckpointDeleted
from schemas.cluster import CapacityReported
from schemas.config import ConfigChange
from schemas.control import EnvAnnouncement
from schemas.dlq import DeadLetter
from schemas.envelope import Event
from schemas.evaluation import EvaluationReport
from schemas.experiments import ExperimentAction, ExperimentSubmitted, TrialDecision, TrialMetrics
from schemas.hosts import HostOrders, HostReported
from schemas.jobs import (
    JobCompleted,
    JobFailed,
    JobHeld,
    JobStarted,
    JobSubmitted,
    NodeExited,
    NodeFailed,
    NodeOOM,
    NodeStarted,
    RuntimeSample,
)
from schemas.lockstep import Barrier, BarrierAck
from schemas.plans import (
    OptimizePlan,
    OptimizeRequest,
    ScalePlan,
    ScaleResult,
    TrainingApplied,
    TrainingRescaled,
)
from schemas.requests import JobDeletion, JobRequest, JobRequestResult

AnyEvent = Annotated[
    JobSubmitted
    | JobStarted
    | JobHeld
    | JobCompleted
    | JobFailed
    | NodeStarted
    | NodeExited
    | NodeFailed
    | NodeOOM
    | RuntimeSample
    | OptimizeRequest
    | OptimizePlan
    | ScalePlan
    | ScaleResult
    | TrainingApplied
    | TrainingRescaled
    | ConfigChange
    | EvaluationReport
    | DeadLetter
    | EnvAnnouncement
    | Barrier
    | BarrierAck
    | CapacityReported
    | JobRequest
    | JobRequestResult
    | JobDeletion
    | ExperimentSubmitted
    | ExperimentAction
    | TrialMetrics
    | TrialDecision
    | CheckpointCommitted
    | CheckpointDeleted
    | HostReported
    | HostOrders,
    Field(discriminator="type"),
]

EVENT_CLASSES: tuple[type[Event], ...] = (
    JobSubmitted,
    JobStarted,
    JobHeld,
    JobCompleted,
    JobFailed,
    NodeStarted,
    NodeExited,
    NodeFailed,
    NodeOOM,
    RuntimeSample,
    OptimizeRequest,
    OptimizePlan,
    ScalePlan,
    ScaleResult,
    TrainingApplied,
    TrainingRescaled,
    ConfigChange,
    EvaluationReport,
    DeadLetter,
    EnvAnnouncement,
    Barrier,
    BarrierAck,
    CapacityReported,
    JobRequest,
    JobRequestResult,
    JobDeletion,
    ExperimentSubmitted,
    ExperimentAction,
    TrialMetrics,
    TrialDecision,
    CheckpointCommitted,
    CheckpointDeleted,
    HostReported,
    HostOrders,
)


def _type_name(cls: type[Event]) -> str:
    default = cls.model_fields["type"].default
    assert isinstance(default, str), cls
    return default


#: type name -> model class
EVENT_TYPES: dict[str, type[Event]] = {_type_name(c): c for c in EVENT_CLASSES}


def event_class(type_name: str) -> type[Event]:
    """The model class of an event type; KeyError names the known types."""
    try:
        return EVENT_TYPES[type_name]
    except KeyError:
        raise KeyError(
            f"unknown event type {type_name!r}; known: {', '.join(sorted(EVENT_TYPES))}"
        ) from None
