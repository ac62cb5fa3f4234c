"""Checkpoints: each one a job committed (CheckpointCommitted) and each one the retention
policy deleted (CheckpointDeleted), on ``<env>.checkpoints``, keyed by the job's uuid so
one job's checkpoints stay in order.

A checkpoint is known to the env by its event: the job (and its trial and experiment,
if it is a trial), the step, the world size and the plan in force when it was saved,
the metrics at that step, where it lies (a URL that fsspec opens: a directory, a shared
filesystem, ``s3://``), its size, and what it cost (the seconds the training step was
blocked, the seconds the persist took behind it). The recorder keeps each as a row of
the env's ``checkpoints`` table (`checkpoint list`); the retention service deletes the
ones the policy no longer keeps and says so with a CheckpointDeleted.

Model versions (``model register``) are rows of the env's Postgres, not events: a
registration is a user's request that wants its answer (the version's number) at once,
no stream processor acts on it, and the guarantee that matters, that retention never
deletes a checkpoint a model version references, holds only when the reference and
the deletion are decided in one database transaction; an event on the bus would leave a
window between the two in which retention could delete the checkpoint being registered.

This module imports nothing of the project but ``schemas``.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from schemas.bounds import Bytes, Rate, Replicas, Steps, Text
from schemas.experiments import MAX_METRICS, MAX_TRIAL_INDEX, ExperimentName, ParamName
from schemas.jobs import JobEvent

CHECKPOINTS_TOPIC = "checkpoints"

#: A checkpoint's id: unique in its env, chosen by the job (the SDK uses
#: ``<job>-<step>-<suffix>``); what `model register --from` and the REST API name.
CheckpointId = Annotated[
    str,
    StringConstraints(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"),
]
#: Where a checkpoint lies: a URL fsspec opens (``file://``, ``s3://``, a plain path).
CheckpointUrl = Annotated[Text, StringConstraints(min_length=1, max_length=2048)]
#: The layout of a checkpoint's files (``dcp``: torch.distributed.checkpoint's).
CheckpointFormat = Annotated[
    str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9._-]*$")
]
#: The largest metric value kept, as for a trial's metrics.
_FINITE = 1e300


class CheckpointReason(StrEnum):
    """Why a checkpoint was saved: ``periodic`` (every N steps or seconds), ``sigterm``
    (the grace period of a preemption, suspension or shrink), ``plan`` (a plan asked for
    it, before a restart-path resize), ``manual`` (the training code asked)."""

    PERIODIC = "periodic"
    SIGTERM = "sigterm"
    PLAN = "plan"
    MANUAL = "manual"


class DeletionReason(StrEnum):
    """Why a checkpoint was deleted: ``retention`` (the env's policy keeps it no longer:
    not among the latest of its job nor the best of its trial or experiment),
    ``manual`` (a user deleted it)."""

    RETENTION = "retention"
    MANUAL = "manual"


class _CheckpointEvent(JobEvent):
    topic: ClassVar[str] = CHECKPOINTS_TOPIC
    checkpoint_id: CheckpointId
    url: CheckpointUrl
    step: Steps = Field(description="the job's global step the state is of")
    experiment: ExperimentName | None = Field(
        default=None, description="the experiment, when the job is one of its trials"
    )
    trial: int | None = Field(default=None, ge=0, le=MAX_TRIAL_INDEX)

    @model_validator(mode="after")
    def _trial_of_experiment(self) -> Any:
        if (self.experiment is None) != (self.trial is None):
            raise ValueError("experiment and trial come together: a trial is of an experiment")
        return self


class CheckpointCommitted(_CheckpointEvent):
    """A checkpoint complete on its storage (its manifest written last), told once by
    rank 0 after the persist. Published again (a retry after a lost answer): the same
    ``checkpoint_id``, kept once."""

    type: Literal["checkpoint.committed"] = "checkpoint.committed"
    world_size: Replicas = Field(description="processes that saved it")
    plan_id: Text | None = Field(
        default=None,
        max_length=256,
        description="the ScalePlan in force when it was saved (its plan_id), when the "
        "job follows plans",
    )
    metrics: dict[ParamName, float] = Field(
        default_factory=dict,
        max_length=MAX_METRICS,
        description="what the job measured at this step (the experiment's metric among "
        "them, for retention's best and `model register --best`)",
    )
    size_bytes: Bytes
    blocking_s: Rate = Field(description="seconds the training step waited for the save")
    persist_s: Rate = Field(description="seconds the persist took, behind training")
    format: CheckpointFormat = "dcp"
    format_version: int = Field(default=1, ge=1, le=1_000)
    reason: CheckpointReason = CheckpointReason.PERIODIC

    @field_validator("metrics")
    @classmethod
    def _finite_values(cls, metrics: dict[str, float]) -> dict[str, float]:
        for name, v in metrics.items():
            if not math.isfinite(v) or abs(v) > _FINITE:
                raise ValueError(f"metric {name!r} must be a finite number, not {v!r}")
        return metrics


class CheckpointDeleted(_CheckpointEvent):
    """A checkpoint's files deleted from its storage, by the retention service or a
    user, and why (``detail``: which rule no longer keeps it)."""

    type: Literal["checkpoint.deleted"] = "checkpoint.deleted"
    reason: DeletionReason
    detail: Text = Field(default="", max_length=1024)


__all__ = [
    "CHECKPOINTS_TOPIC",
    "CheckpointCommitted",
    "CheckpointDeleted",
    "CheckpointFormat",
    "CheckpointId",
    "CheckpointReason",
    "CheckpointUrl",
    "DeletionReason",
]
