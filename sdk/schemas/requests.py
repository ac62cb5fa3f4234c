"""Jobs a stream processor asks the env's operator to create (JobRequest), and the
operator's answer (JobRequestResult).

A ScalePlan can only change a job that exists, and streams/ may not import the doors
that create jobs (`job submit`, the jobs API): a searcher of an experiment that wants a
trial run asks on the bus instead, and the env's operator answers as it answers a
ScalePlan. Both events share ``<env>.job.requests``, keyed by the job's name, so an
answer follows its request in one partition and a requester reads one topic.

A request is created at most once per ``request_id``: delivered again (a consumer's
redelivery, a requester's retry) it gets its first answer again, whatever became of the
job since.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints, model_validator

from schemas.bounds import Document, Text
from schemas.envelope import Event
from schemas.jobs import JobMeta

#: What the operator keeps as a label of the job (a Kubernetes label value), so a job
#: can be found by the request that made it and by its owner: 1 to 63 characters,
#: letters, digits, '-', '_' and '.', a letter or digit at both ends.
LabelValue = Annotated[
    str,
    StringConstraints(
        min_length=1, max_length=63, pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"
    ),
]
#: A job's name on every platform: a DNS label (the local platform's file names, a
#: Kubernetes Service named after the job).
JobName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"),
]

JOB_REQUESTS_TOPIC = "job.requests"


class JobRequest(Event):
    """Create a job from its TrainingJob document (the document `job submit` takes),
    asked by ``source``, for ``reason``, on behalf of ``owner``."""

    topic: ClassVar[str] = JOB_REQUESTS_TOPIC
    type: Literal["job.request"] = "job.request"
    request_id: LabelValue = Field(
        description="the requester's id of this request: a job is created at most once per "
        "id, and the id is kept as the job's label dlrover-events.io/request"
    )
    name: JobName = Field(description="the job's name; the document's metadata.name, if any")
    document: Document = Field(
        description="the TrainingJob, as `job submit` takes it, checked by the same rules"
    )
    reason: Text = Field(default="", max_length=1024, description="why the job is asked for")
    owner: LabelValue | None = Field(
        default=None,
        description="whose the job is (an experiment): kept as the job's label "
        "dlrover-events.io/owner, so an owner's jobs can be found and deleted together",
    )

    @model_validator(mode="after")
    def _key_is_name_and_source_says_who(self) -> JobRequest:
        if not self.source:
            raise ValueError("a job request says who asks (source)")
        if self.key is None:
            self.key = self.name
        elif self.key != self.name:
            raise ValueError(f"key {self.key!r} must be the job's name {self.name!r}")
        return self


class JobDeletion(Event):
    """Delete job ``name``, asked by ``source`` on behalf of ``owner`` (an experiment
    killed, a trial no longer wanted). Only a job whose label dlrover-events.io/owner is
    ``owner`` is deleted: a requester can never delete someone else's job. Answered by a
    JobRequestResult (``deleted``, ``absent`` or ``refused``) on the same topic and key."""

    topic: ClassVar[str] = JOB_REQUESTS_TOPIC
    type: Literal["job.deletion"] = "job.deletion"
    request_id: LabelValue
    name: JobName
    owner: LabelValue
    reason: Text = Field(default="", max_length=1024)

    @model_validator(mode="after")
    def _key_is_name_and_source_says_who(self) -> JobDeletion:
        if not self.source:
            raise ValueError("a job deletion says who asks (source)")
        if self.key is None:
            self.key = self.name
        elif self.key != self.name:
            raise ValueError(f"key {self.key!r} must be the job's name {self.name!r}")
        return self


class JobRequestStatus(StrEnum):
    """What became of a job request. ``created``: the job was created by this request
    (also when the same request is delivered again). ``exists``: a job of that name
    was there already, made by someone else; nothing was created. ``refused``: the
    document breaks the rules of `job submit`, or the platform would not take it;
    ``reason`` says why. ``failed``: the operator could not decide (a bug of ours)."""

    CREATED = "created"
    EXISTS = "exists"
    REFUSED = "refused"
    FAILED = "failed"
    DELETED = "deleted"
    ABSENT = "absent"


class JobRequestResult(Event):
    """The operator's answer to one JobRequest, on the request's topic and key."""

    topic: ClassVar[str] = JOB_REQUESTS_TOPIC
    type: Literal["job.request.result"] = "job.request.result"
    request_id: LabelValue
    name: JobName
    status: JobRequestStatus
    reason: Text = Field(default="", max_length=2048)
    job: JobMeta | None = Field(
        default=None,
        description="the job of that name (created or existing): its uid keys its events",
    )
    owner: LabelValue | None = None
    requester: Text = Field(
        default="", max_length=256, description="who asked: the request's source"
    )

    @model_validator(mode="after")
    def _key_is_name(self) -> JobRequestResult:
        if self.key is None:
            self.key = self.name
        elif self.key != self.name:
            raise ValueError(f"key {self.key!r} must be the job's name {self.name!r}")
        if self.status in (JobRequestStatus.CREATED, JobRequestStatus.EXISTS) and not self.job:
            raise ValueError(f"a {self.status.value} result names the job")
        return self


__all__ = [
    "JOB_REQUESTS_TOPIC",
    "JobDeletion",
    "JobName",
    "JobRequest",
    "JobRequestResult",
    "JobRequestStatus",
    "LabelValue",
]
