"""Event contracts of dlrover-events: every event and plan on the bus, and the codec.

This package imports nothing of the project, so any producer (a training job, a tool in
another language through the JSON Schema files in ``schemas/json``) shares one contract.
"""

from schemas.codec import CodecError, DecodeFailure, decode, encode
from schemas.config import ConfigChange, ConfigDocument
from schemas.control import EnvAnnouncement, EnvMode
from schemas.dlq import DeadLetter
from schemas.envelope import SCHEMA_VERSION, Event
from schemas.evaluation import EvaluationReport
from schemas.events import (
    EVENT_TYPES,
    AnyEvent,
    event_class,
)
from schemas.jobs import (
    JobCompleted,
    JobFailed,
    JobMeta,
    JobStarted,
    JobSubmitted,
    NodeExited,
    NodeFailed,
    NodeOOM,
    NodeStarted,
    OOMKind,
    RuntimeSample,
)
from schemas.plans import (
    JobPlan,
    MigrateNode,
    Node,
    NodeGroupResource,
    NodeResource,
    NotApplied,
    OptimizePlan,
    OptimizeRequest,
    RescaleMode,
    RescalePhases,
    ResourcePlan,
    ScalePlan,
    ScaleResult,
    ScaleStatus,
    TrainingApplied,
    TrainingRescaled,
)
from schemas.requests import JobRequest, JobRequestResult, JobRequestStatus

__all__ = [
    "EVENT_TYPES",
    "SCHEMA_VERSION",
    "AnyEvent",
    "CodecError",
    "ConfigChange",
    "ConfigDocument",
    "DeadLetter",
    "DecodeFailure",
    "EnvAnnouncement",
    "EnvMode",
    "EvaluationReport",
    "Event",
    "JobCompleted",
    "JobFailed",
    "JobMeta",
    "JobPlan",
    "JobRequest",
    "JobRequestResult",
    "JobRequestStatus",
    "JobStarted",
    "JobSubmitted",
    "MigrateNode",
    "Node",
    "NodeExited",
    "NodeFailed",
    "NodeGroupResource",
    "NodeOOM",
    "NodeResource",
    "NodeStarted",
    "NotApplied",
    "OOMKind",
    "OptimizePlan",
    "OptimizeRequest",
    "RescaleMode",
    "RescalePhases",
    "ResourcePlan",
    "RuntimeSample",
    "ScalePlan",
    "ScaleResult",
    "ScaleStatus",
    "TrainingApplied",
    "TrainingRescaled",
    "decode",
    "encode",
    "event_class",
]
