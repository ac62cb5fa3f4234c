"""What the reconciler decides about a JobRequest (schemas/requests.py), pure: the job to
create, or the answer without one.

A stream processor (an experiment's searcher) cannot import the doors that create jobs,
so it asks on ``<env>.job.requests``. Its document is checked by the rules `job submit`
uses (handlers.operator.document.submission) and marked with the request that made it
(label ``dlrover-events.io/request``) and its owner (``dlrover-events.io/owner``): a
request delivered again after its job was created, before its answer was recorded (a
crash in between), finds the job marked as its own and is answered ``created`` again,
never a second job; a job of that name made by anyone else is ``exists``.

A JobDeletion (an experiment killed) deletes a job only when its owner label is the
deletion's owner, so a requester can delete no one else's job: ``deleted``, ``absent``
(no job of that name) or ``refused`` (someone else's, or one the platform cannot read).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from handlers.operator.document.submission import JobRequestError, submission
from handlers.operator.platform.api import JobEntry
from handlers.operator.platform.bodies import DOMAIN, JobView
from handlers.operator.reconcile.events import job_meta
from schemas.jobs import JobMeta
from schemas.requests import JobDeletion, JobRequest, JobRequestResult, JobRequestStatus

#: The label that names the request a job was created by.
REQUEST_LABEL = f"{DOMAIN}/request"
#: The label that names whose a requested job is (an experiment).
OWNER_LABEL = f"{DOMAIN}/owner"
#: The answers kept for good in the ledger: a request delivered again gets them again.
FINAL = frozenset(
    {
        JobRequestStatus.CREATED,
        JobRequestStatus.EXISTS,
        JobRequestStatus.REFUSED,
        JobRequestStatus.DELETED,
        JobRequestStatus.ABSENT,
    }
)
#: The reason of an answer given again to a request delivered again.
ALREADY_ANSWERED = "already answered"

_RESULT_NAMESPACE = uuid.UUID("b3e1f0a4-6c2d-4e8f-9a7b-5d3c1e2f4a6b")
_MAX_REASON = 2048


@dataclass(frozen=True)
class Answer:
    """What became of a request: its status, why, and the job it names (created or
    there already)."""

    status: JobRequestStatus
    reason: str
    job: JobMeta | None = None

    def repeated(self) -> Answer:
        """The answer to the request delivered again: the same status and job, the reason
        saying it is a repeat."""
        reason = f"{ALREADY_ANSWERED}: {self.reason}" if self.reason else ALREADY_ANSWERED
        return Answer(self.status, reason, self.job)


def document_of(request: JobRequest) -> dict[str, Any] | Answer:
    """The TrainingJob to create for ``request``, checked as `job submit` checks one and
    labelled with the request and its owner; or the refusal that says why not."""
    body = dict(request.document)
    meta = body.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, Mapping):
        return Answer(JobRequestStatus.REFUSED, "the document's metadata must be an object")
    named = meta.get("name", request.name)
    if named != request.name:
        return Answer(
            JobRequestStatus.REFUSED,
            f"the document names job {named!r}, the request {request.name!r}",
        )
    labels = meta.get("labels") or {}
    if not isinstance(labels, Mapping):
        return Answer(JobRequestStatus.REFUSED, "the document's metadata.labels must be an object")
    marks = {REQUEST_LABEL: request.request_id}
    if request.owner is not None:
        marks[OWNER_LABEL] = request.owner
    body["metadata"] = {**meta, "name": request.name, "labels": {**labels, **marks}}
    try:
        return submission(body)
    except JobRequestError as e:
        return Answer(JobRequestStatus.REFUSED, f"invalid job: {e}")


def answer_existing(request: JobRequest, job: JobEntry) -> Answer:
    """The answer when a job of the requested name is there: ``created`` when this
    request made it (its label says so), ``exists`` otherwise."""
    if isinstance(job, JobView) and job.labels.get(REQUEST_LABEL) == request.request_id:
        return Answer(
            JobRequestStatus.CREATED,
            f"job {job.name} was created by this request before",
            job_meta(job),
        )
    meta = job_meta(job) if isinstance(job, JobView) else JobMeta(uuid=job.uid, name=job.name)
    by = job.labels.get(REQUEST_LABEL) if isinstance(job, JobView) else None
    return Answer(
        JobRequestStatus.EXISTS,
        f"job {job.name} exists already (uid {job.uid}"
        + (f", created by request {by})" if by else ")")
        + ": nothing was created",
        meta,
    )


def created(job: JobView, platform: str) -> Answer:
    return Answer(
        JobRequestStatus.CREATED,
        f"job {job.name} created on the {platform} platform",
        job_meta(job),
    )


def deletion_refusal(deletion: JobDeletion, job: JobEntry | None) -> Answer | None:
    """The answer to ``deletion`` when its job is not to be deleted: ``absent`` when there
    is none, ``refused`` when it is not the deletion owner's (its owner label says
    another, or none) or the platform cannot read it; None: delete it."""
    if job is None:
        return Answer(JobRequestStatus.ABSENT, f"no job {deletion.name}: nothing was deleted")
    if not isinstance(job, JobView):
        return Answer(
            JobRequestStatus.REFUSED,
            f"job {job.name} cannot be read ({job.reason}), so whose it is is unknown: "
            "nothing was deleted",
            JobMeta(uuid=job.uid, name=job.name),
        )
    owner = job.labels.get(OWNER_LABEL)
    if owner != deletion.owner:
        whose = f"owned by {owner}" if owner else f"owned by no one (no label {OWNER_LABEL})"
        return Answer(
            JobRequestStatus.REFUSED,
            f"job {job.name} is {whose}, not by {deletion.owner}: nothing was deleted",
            job_meta(job),
        )
    return None


def deleted(job: JobView, platform: str) -> Answer:
    return Answer(
        JobRequestStatus.DELETED,
        f"job {job.name} deleted on the {platform} platform",
        job_meta(job),
    )


def result(
    env: str, request: JobRequest | JobDeletion, answer: Answer, source: str
) -> JobRequestResult:
    """The answer as an event: the same delivery answered the same way keeps its id, so
    an answer published again after a crash duplicates nothing downstream."""
    reason = answer.reason
    if len(reason) > _MAX_REASON:
        reason = reason[: _MAX_REASON - 3] + "..."
    return JobRequestResult(
        env=env,
        source=source,
        event_id=uuid.uuid5(
            _RESULT_NAMESPACE,
            f"{env}/{request.event_id}/{answer.status.value}/{reason}",
        ),
        request_id=request.request_id,
        name=request.name,
        status=answer.status,
        reason=reason,
        job=answer.job,
        owner=request.owner,
        requester=request.source,
    )


__all__ = [
    "ALREADY_ANSWERED",
    "FINAL",
    "OWNER_LABEL",
    "REQUEST_LABEL",
    "Answer",
    "answer_existing",
    "created",
    "deleted",
    "deletion_refusal",
    "document_of",
    "result",
]
