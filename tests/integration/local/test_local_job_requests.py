"""A JobRequest on the bus makes the local platform's reconciler create the job, whose
nodes then run as processes, and answer on <env>.job.requests; a bad document is refused
with why, a request that breaks the event's schema is dead-lettered with why, and a request
read again, by an operator started again, is answered from the env's ledger without a
second job (the same path as on Kubernetes: the reconciler's intake over the port)."""

from __future__ import annotations

import asyncio
import contextlib

from dlrover_events.bus.topics import DLQ, JOB_REQUESTS, topic
from handlers.operator.platform.bodies import JobView
from handlers.operator.reconcile.requests import OWNER_LABEL, REQUEST_LABEL
from schemas.codec import CodecError, decode, encode
from schemas.dlq import DeadLetter, FailureKind
from schemas.jobs import JobSubmitted
from schemas.requests import JobRequest, JobRequestResult, JobRequestStatus
from tests.integration.local.conftest import Local, shims
from tests.integration.local.test_local_platform import running, sleeper_job, until
from tests.integration.tap import DEADLINE_S, Tap


class RequestsTap(Tap):
    """A tap that reads past the records that are no event (the test's own malformed
    request among them), as the operator's consumer does by dead-lettering them."""

    async def _read(self) -> None:
        while True:
            batch = await self._consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for record in records:
                    with contextlib.suppress(CodecError):
                        self.events.append(decode(record.value))


def ask(local: Local, request_id: str, name: str, replicas: int = 2) -> JobRequest:
    return JobRequest(
        env=local.env,
        source="searcher-test",
        request_id=request_id,
        name=name,
        document=sleeper_job(name, replicas),
        reason="a trial of experiment lr-sweep",
        owner="lr-sweep",
    )


async def answers(tap: Tap, name: str, request_id: str, n: int) -> list[JobRequestResult]:
    def got() -> list[JobRequestResult] | None:
        found = [r for r in tap.of(JobRequestResult, name) if r.request_id == request_id]
        return found if len(found) >= n else None

    return await tap.until(got, f"{n} answer(s) to {request_id}")


async def test_a_job_request_creates_the_job_once_and_a_bad_one_is_refused(
    local: Local,
) -> None:
    tap = RequestsTap(local.settings, local.env, (JOB_REQUESTS, DLQ))
    await tap.start()
    ctx, task = await local.start_operator()
    try:
        asked = ask(local, "trial-1-req", "trial-1")
        await local.producer.publish(asked)
        [created] = await answers(tap, "trial-1", "trial-1-req", 1)
        assert created.status == JobRequestStatus.CREATED, created
        assert created.requester == "searcher-test" and created.owner == "lr-sweep"
        job = await local.cluster().get_job("trial-1")
        assert isinstance(job, JobView)
        assert created.job is not None and created.job.uuid == job.uid
        assert job.labels[REQUEST_LABEL] == "trial-1-req" and job.labels[OWNER_LABEL] == "lr-sweep"
        # the operator runs it as any submitted job: its nodes are processes, its events
        # carry the uid the answer named
        await local.tap.first(JobSubmitted, job.uid, lambda e: True, "job.submitted")
        await until("2 running nodes", lambda: _running(local, "trial-1", 2))

        # a document `job submit` would refuse is refused, with the same words
        bad = ask(local, "trial-2-req", "trial-2", replicas=9)
        await local.producer.publish(bad)
        [refused] = await answers(tap, "trial-2", "trial-2-req", 1)
        assert refused.status == JobRequestStatus.REFUSED
        assert refused.reason == "invalid job: role worker: 9 replicas, above maxReplicas 4"
        assert refused.job is None
        assert await local.cluster().get_job("trial-2") is None

        # a request that breaks the event's schema (no source: who asks?) is no request:
        # it is dead-lettered, with why, and answered by no one
        nameless = encode(asked).replace(b'"source":"searcher-test"', b'"source":""')
        assert nameless != encode(asked)
        await local.producer.send_raw(topic(local.env, JOB_REQUESTS), nameless, b"trial-1")
        letter = await tap.until(
            lambda: next(
                (
                    d
                    for d in tap.of(DeadLetter)
                    if d.original_topic == topic(local.env, JOB_REQUESTS)
                ),
                None,
            ),
            "a dead letter of the request without a source",
        )
        assert letter.error_kind == FailureKind.INVALID
        assert "a job request says who asks (source)" in letter.error
        assert letter.consumer_group == f"{local.env}.operator"
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, DEADLINE_S)

    # Another operator of the env, later: the same request, delivered again after its job
    # was deleted, is answered from the env's ledger as it was the first time; no new job.
    await local.cluster().delete_job("trial-1")
    ctx, task = await local.start_operator()
    try:
        await local.producer.publish(asked)
        again = (await answers(tap, "trial-1", "trial-1-req", 2))[-1]
        assert (again.status, again.job) == (JobRequestStatus.CREATED, created.job)
        assert again.reason == f"already answered: {created.reason}"
        assert await local.cluster().get_job("trial-1") is None
        assert len(tap.of(JobRequestResult, "trial-2")) == 1
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, DEADLINE_S)
        await tap.stop()
    assert not shims(local.root), "a clean stop ends the nodes' processes"


async def _running(local: Local, job: str, n: int) -> bool:
    return len(running(await local.pods(job))) == n
