"""The reconciler's intake of JobRequests and JobDeletions: each request answered once,
its job created (``Platform.submit_job``) or deleted (``Platform.delete_job``, only when
the deletion's owner owns it) through the platform port, the answer kept in the env's
``job_requests`` table and published on ``<env>.job.requests``. A thin shell around
requests.py, on any platform the reconciler drives.

A request is created at most once across restarts: its answer is recorded before it is
published and before the consumer commits, and a job created just before a crash carries
the request's label, so the request read again finds it its own. The platform away, or
the lease lost (NotLeader), raises: nothing is recorded, and the consumer (or the next
leader's) reads the request again. A deletion read again after its job was deleted and
before its answer was kept finds no job: ``absent``, which is as final for its requester.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from pydantic import TypeAdapter

from dlrover_events.runtime.logs import log_fields
from handlers.operator.platform.api import Platform
from handlers.operator.platform.bodies import JobView
from handlers.operator.platform.errors import Conflict, Invalid, PlatformError
from handlers.operator.reconcile import requests
from handlers.operator.reconcile.ledger import Database
from handlers.operator.reconcile.requests import FINAL, Answer
from schemas.envelope import Event
from schemas.jobs import JobMeta
from schemas.requests import JobDeletion, JobRequest, JobRequestStatus

log = logging.getLogger(__name__)

_META: TypeAdapter[JobMeta | None] = TypeAdapter(JobMeta | None)


class RequestLedger:
    """The env's answers to job requests, one row per request id, never changed."""

    def __init__(self, pool: Database) -> None:
        self._pool = pool

    async def answer(self, request_id: str) -> Answer | None:
        row = await self._pool.fetchrow(
            "SELECT status, reason, job FROM job_requests WHERE request_id = $1", request_id
        )
        if row is None:
            return None
        return Answer(
            JobRequestStatus(row["status"]), row["reason"], _META.validate_python(row["job"])
        )

    async def record(self, request: JobRequest | JobDeletion, answer: Answer) -> bool:
        """Keep a final answer; False when the request had one already (left as is)."""
        row = await self._pool.fetchval(
            """
            INSERT INTO job_requests (request_id, name, requester, owner, status, reason, job)
            VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb)
            ON CONFLICT (request_id) DO NOTHING
            RETURNING request_id
            """,
            request.request_id,
            request.name,
            request.source,
            request.owner,
            answer.status.value,
            answer.reason,
            None if answer.job is None else answer.job.model_dump(mode="json"),
        )
        return row is not None


class JobIntake:
    """Answers an env's job requests and deletions on ``platform``, publishing each answer
    with ``publish``."""

    def __init__(
        self,
        env: str,
        platform: Platform,
        ledger: RequestLedger,
        publish: Callable[[Event], Awaitable[None]],
        source: str,
    ) -> None:
        self.env = env
        self.platform = platform
        self.ledger = ledger
        self.publish = publish
        self.source = source

    async def answer_all(self, batch: list[JobRequest | JobDeletion]) -> None:
        """The batch's requests one after another, in the order read: two requests for one
        name get consistent answers (the second finds the first's job, a deletion after a
        creation deletes what it created)."""
        for request in batch:
            with log_fields(job=request.name, request_id=request.request_id):
                await self.answer(request)

    async def answer(self, request: JobRequest | JobDeletion) -> None:
        earlier = await self.ledger.answer(request.request_id)
        if earlier is not None:
            answer = earlier.repeated()
        else:
            try:
                if isinstance(request, JobDeletion):
                    answer = await self._delete(request)
                else:
                    answer = await self._decide(request)
            except (asyncio.CancelledError, PlatformError, OSError):
                raise  # the platform, the network, the lease: read again, nothing kept
            except Exception as e:
                log.exception("env %s: job request %s", self.env, request.request_id)
                answer = Answer(JobRequestStatus.FAILED, f"operator error: {e!r}")
            if answer.status in FINAL and not await self.ledger.record(request, answer):
                # another delivery recorded it first: answer as that one was answered
                first = await self.ledger.answer(request.request_id)
                answer = first.repeated() if first is not None else answer
        log.info(
            "env %s: job %s %s for %s from %s %s: %s",
            self.env,
            "deletion" if isinstance(request, JobDeletion) else "request",
            request.request_id,
            request.name,
            request.source,
            answer.status.value,
            answer.reason,
        )
        await self.publish(requests.result(self.env, request, answer, self.source))

    async def _decide(self, request: JobRequest) -> Answer:
        document = requests.document_of(request)
        if isinstance(document, Answer):
            return document
        for _ in range(3):
            existing = await self.platform.get_job(request.name)
            if existing is not None:
                return requests.answer_existing(request, existing)
            try:
                job = await self.platform.submit_job(document)
            except Conflict:
                continue  # made meanwhile: answer from what is there now
            except Invalid as e:
                return Answer(JobRequestStatus.REFUSED, f"the {self.platform.name} platform: {e}")
            return requests.created(job, self.platform.name)
        return Answer(
            JobRequestStatus.FAILED, f"job {request.name} was created and deleted meanwhile"
        )

    async def _delete(self, deletion: JobDeletion) -> Answer:
        job = await self.platform.get_job(deletion.name)
        refusal = requests.deletion_refusal(deletion, job)
        if refusal is not None:
            return refusal
        assert isinstance(job, JobView)  # deletion_refusal answers every other case
        if not await self.platform.delete_job(deletion.name):
            return Answer(
                JobRequestStatus.ABSENT,
                f"job {deletion.name} was gone meanwhile: nothing was deleted",
            )
        return requests.deleted(job, self.platform.name)


__all__ = ["JobIntake", "RequestLedger"]
