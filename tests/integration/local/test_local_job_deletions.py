"""A JobDeletion on the bus makes the local platform's reconciler delete the job its
owner asked for, whose node processes then end, and answer on <env>.job.requests: another
owner's job, or one made by hand, is refused and kept; a name with no job is absent; a
deletion read again is answered from the env's ledger as it was the first time (the same
path as on Kubernetes: the reconciler's intake over the port)."""

from __future__ import annotations

import asyncio

from dlrover_events.bus.topics import JOB_REQUESTS
from handlers.operator.platform.bodies import JobView
from schemas.requests import JobDeletion, JobRequestResult, JobRequestStatus
from tests.integration.local.conftest import Local
from tests.integration.local.test_local_job_requests import RequestsTap, answers, ask
from tests.integration.local.test_local_platform import running, sleeper_job, until
from tests.integration.tap import DEADLINE_S


def delete(local: Local, request_id: str, name: str, owner: str = "lr-sweep") -> JobDeletion:
    return JobDeletion(
        env=local.env,
        source="searcher-test",
        request_id=request_id,
        name=name,
        owner=owner,
        reason="experiment lr-sweep killed",
    )


async def _nodes(local: Local, job: str, n: int) -> bool:
    return len(running(await local.pods(job))) == n


async def test_a_deletion_deletes_only_its_owner_s_job(local: Local) -> None:
    tap = RequestsTap(local.settings, local.env, (JOB_REQUESTS,))
    await tap.start()
    ctx, task = await local.start_operator()
    try:
        # a trial's job, asked for by its experiment, running; one made by hand beside it
        await local.producer.publish(ask(local, "trial-1", "trial-1"))
        [made] = await answers(tap, "trial-1", "trial-1", 1)
        assert made.status == JobRequestStatus.CREATED, made
        await local.submit(sleeper_job("by-hand", 1))
        await until("2 running nodes of trial-1", lambda: _nodes(local, "trial-1", 2))

        # another owner may not delete it, nor the hand-made one
        await local.producer.publish(delete(local, "d-other", "trial-1", owner="other-sweep"))
        [refused] = await answers(tap, "trial-1", "d-other", 1)
        assert refused.status == JobRequestStatus.REFUSED
        assert refused.reason == (
            "job trial-1 is owned by lr-sweep, not by other-sweep: nothing was deleted"
        )
        await local.producer.publish(delete(local, "d-hand", "by-hand"))
        [kept] = await answers(tap, "by-hand", "d-hand", 1)
        assert kept.status == JobRequestStatus.REFUSED
        assert isinstance(await local.cluster().get_job("by-hand"), JobView)

        # its owner deletes it: the job goes, and the operator ends its nodes
        await local.producer.publish(delete(local, "d-1", "trial-1"))
        [gone] = await answers(tap, "trial-1", "d-1", 1)
        assert gone.status == JobRequestStatus.DELETED, gone
        assert gone.job == made.job
        assert (gone.requester, gone.owner) == ("searcher-test", "lr-sweep")
        assert await local.cluster().get_job("trial-1") is None
        await until("trial-1's nodes gone", lambda: _no_pods(local, "trial-1"))

        # a name with no job: absent
        await local.producer.publish(delete(local, "d-none", "trial-9"))
        [absent] = await answers(tap, "trial-9", "d-none", 1)
        assert absent.status == JobRequestStatus.ABSENT
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, DEADLINE_S)

    # another operator of the env, later, a job of that name made again meanwhile: the
    # deletion delivered again gets its first answer, and deletes nothing
    await local.submit(sleeper_job("trial-1", 1))
    ctx, task = await local.start_operator()
    try:
        await local.producer.publish(delete(local, "d-1", "trial-1"))
        again = (await answers(tap, "trial-1", "d-1", 2))[-1]
        assert (again.status, again.job) == (JobRequestStatus.DELETED, made.job)
        assert again.reason == f"already answered: {gone.reason}"
        assert isinstance(await local.cluster().get_job("trial-1"), JobView)
        assert len([r for r in tap.of(JobRequestResult) if r.request_id == "d-none"]) == 1
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, DEADLINE_S)
        await tap.stop()


async def _no_pods(local: Local, job: str) -> bool:
    return not await local.pods(job)
