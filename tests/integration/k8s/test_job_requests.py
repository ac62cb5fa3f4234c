"""A JobRequest answered by the Kubernetes reconciler on the real kube-apiserver v1.20.2,
as the operator's ServiceAccount under deploy/rbac/operator.yaml (whose Role must let it
create TrainingJobs): the TrainingJob created with the request's labels, its pods made;
a document the CRD refuses is refused with the API server's words."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import JOB_EVENTS, JOB_REQUESTS
from dlrover_events.settings import Settings
from handlers.operator.reconcile.requests import OWNER_LABEL, REQUEST_LABEL
from schemas.jobs import JobSubmitted
from schemas.requests import JobRequest, JobRequestResult, JobRequestStatus
from tests.integration.tap import Tap

from .kube import GROUP, VERSION
from .test_elastic_jobs import as_operator  # noqa: F401 (the fixture)
from .test_reconciler_support import Cluster, role, until

pytestmark = pytest.mark.integration


@pytest.fixture
async def tap(settings: Settings, env: str) -> AsyncIterator[Tap]:
    t = Tap(settings, env, (JOB_REQUESTS, JOB_EVENTS))
    await t.start()
    try:
        yield t
    finally:
        await t.stop()


def ask(env: str, name: str, **worker: object) -> JobRequest:
    return JobRequest(
        env=env,
        source="searcher-test",
        request_id=f"req-{name}",
        name=name,
        document={
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainingJob",
            "spec": {"roles": {"worker": role(2, **worker)}},
        },
        reason="a trial",
        owner="lr-sweep",
    )


async def answer(tap: Tap, name: str) -> JobRequestResult:
    return await tap.until(lambda: next(iter(tap.of(JobRequestResult, name)), None), name)


async def test_a_job_request_creates_a_trainingjob_as_the_operator(
    as_operator: Cluster,  # noqa: F811 (the fixture)
    env: str,
    tap: Tap,
    settings: Settings,
) -> None:
    cluster = as_operator
    await cluster.start(env)
    name = f"trial-{uuid.uuid4().hex[:6]}"
    async with Producer(settings) as producer:
        await producer.publish(ask(env, name))
        created = await answer(tap, name)
        assert created.status == JobRequestStatus.CREATED, created
        job = await cluster.job(name)
        assert job is not None and created.job is not None and created.job.uuid == job.uid
        assert job.labels[REQUEST_LABEL] == f"req-{name}"
        assert job.labels[OWNER_LABEL] == "lr-sweep"
        await until(lambda: cluster.workers_running(name, 2), "2 running workers")
        await tap.until(lambda: tap.of(JobSubmitted, job.uid), "job.submitted")

        # the CRD's schema refuses a restart policy it does not know: the answer says so
        odd = f"odd-{uuid.uuid4().hex[:6]}"
        await producer.publish(ask(env, odd, restartPolicy="Sometimes"))
        refused = await answer(tap, odd)
        assert refused.status == JobRequestStatus.REFUSED, refused
        assert refused.reason.startswith("the Kubernetes platform: "), refused.reason
        assert "Sometimes" in refused.reason, refused.reason
        assert await cluster.job(odd) is None
