"""A job's latest plan (``schemas.plans.JobPlan``) folded from the bus: the pure half.

The gateway reads ``<env>.job.events``, ``<env>.brain.plans``, ``<env>.scale.plans`` and
``<env>.scale.results`` from the beginning; every record of a job goes through ``fold``
and the answer a client gets is ``render`` of the result. Nothing here does I/O, so the
view a gateway serves is a function of the records it read, in the order it read them.

"Latest" is the latest read: one job's events are keyed by its uuid, so each topic hands
them over in the order they were published. Across topics there is no order, which is
why a job keeps its last few ScaleResults: the result of a plan may be read before the
plan itself.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

import orjson
from aiokafka import ConsumerRecord
from pydantic import Field

from schemas.codec import CodecError, check_env, decode_obj
from schemas.envelope import Model
from schemas.jobs import JobCompleted, JobEvent, JobFailed, JobMeta, JobSubmitted
from schemas.plans import (
    JobPlan,
    OptimizePlan,
    ScalePlan,
    ScaleResult,
    TrainingApplied,
)

#: The event types a plan view is made of; the others (runtime samples are not even on
#: these topics, node events, barriers, requests) are skipped before a full decode, so a
#: long job.events topic costs a JSON parse per record, not a validation.
FINISHING = frozenset({"job.completed", "job.failed"})
WANTED = (
    frozenset({"job.submitted", "training.applied", "brain.plan", "scale.plan", "scale.result"})
    | FINISHING
)
#: ScaleResults kept per job, for a ScalePlan read after its result (other topic).
RESULTS_KEPT = 8
#: Longest job uuid (JobMeta's bound): a longer one cannot be a job.
MAX_JOB = 256


@dataclass(frozen=True, slots=True)
class JobPlans:
    """What the gateway knows of one job; ``finished`` jobs are evicted first."""

    job: JobMeta
    submitted: bool = False
    finished: bool = False
    optimize_plan: OptimizePlan | None = None
    scale_plan: ScalePlan | None = None
    results: tuple[ScaleResult, ...] = ()
    training_applied: TrainingApplied | None = None

    def result(self) -> ScaleResult | None:
        """The operator's latest answer to the latest ScalePlan, if it was read."""
        if self.scale_plan is None:
            return None
        plan_id = self.scale_plan.plan_id
        return next((r for r in reversed(self.results) if r.plan_id == plan_id), None)

    def plan(self) -> JobPlan:
        return JobPlan(
            job=self.job,
            optimize_plan=self.optimize_plan,
            scale_plan=self.scale_plan,
            result=self.result(),
            training_applied=self.training_applied,
        )


def fold(view: JobPlans | None, event: JobEvent) -> JobPlans | None:
    """The job's view after ``event``; None while the job is not known.

    A job is known from its submission or any plan, result or confirmation of it; its
    end alone does not make it worth remembering. Until its submission is read, the
    job's meta is the one the latest event carried (the brain copies the submission's).
    """
    if view is None:
        if event.type in FINISHING:
            return None
        view = JobPlans(job=event.job)
    elif not view.submitted:
        view = replace(view, job=event.job)
    match event:
        case JobSubmitted():
            return replace(view, job=event.job, submitted=True, finished=False)
        case JobCompleted() | JobFailed():
            return replace(view, finished=True)
        case OptimizePlan():
            return replace(view, optimize_plan=event)
        case ScalePlan():
            return replace(view, scale_plan=event)
        case ScaleResult():
            kept = tuple(r for r in view.results if r.plan_id != event.plan_id)
            return replace(view, results=(*kept, event)[-RESULTS_KEPT:])
        case TrainingApplied():
            return replace(view, training_applied=event)
    return view


def read_record(env: str, record: ConsumerRecord) -> JobEvent | str | None:
    """A job event the plan view is made of, None for a record it is not made of, or why
    the record is unusable (counted, not dead-lettered: the brain's consumers already
    dead-letter what is on these topics, and every gateway would file the same letter)."""
    if record.value is None:
        return None
    try:
        obj = orjson.loads(record.value)
    except orjson.JSONDecodeError as err:
        return f"not JSON: {err}"
    if not isinstance(obj, dict) or obj.get("type") not in WANTED:
        return None
    try:
        event = check_env(decode_obj(obj), env, record.topic)
    except CodecError as err:
        return str(err)
    if not isinstance(event, JobEvent):
        return f"a {event.type} event is not a job's"
    return event


@dataclass(frozen=True, slots=True)
class PlanAnswer:
    """The body a client gets and its strong tag: a hash of exactly those bytes, so the
    tag changes when (and only when) some part of the plan does."""

    etag: str
    body: bytes


def render(view: JobPlans) -> PlanAnswer:
    body = orjson.dumps(view.plan().model_dump(mode="json", by_alias=True))
    return PlanAnswer(f'"{hashlib.sha256(body).hexdigest()[:32]}"', body)


# --- POST /v1/jobs/{job}/optimize ---------------------------------------------------------

#: Longest stage and optimizer names taken: far above any real one, and bounded because
#: the brain keeps a cache keyed by stage spelling.
MAX_NAME = 128


class OptimizeBody(Model):
    """What a client asks for; the gateway adds the job's meta and the envelope."""

    stage: str = Field(min_length=1, max_length=MAX_NAME, description="the job's stage")
    optimizer: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NAME,
        description="an optimizer to use for this request; null: the job's route",
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="merged into the job's config (optimizer, optimizer_params, ...)",
    )


def has_nul(value: Any) -> bool:
    """Whether a JSON value holds a NUL character anywhere: Postgres's jsonb (the
    archive of every event) cannot store one, so such a request would never be archived."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(k) or has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_nul(v) for v in value)
    return False
