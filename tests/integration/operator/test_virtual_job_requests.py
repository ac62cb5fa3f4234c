"""A virtual env's operator refuses a JobRequest, saying why (its jobs are the workload
replayed into it), and creates nothing in its simulated cluster."""

from __future__ import annotations

import pytest

from dlrover_events.bus.topics import JOB_REQUESTS
from handlers.operator.virtual.operator import NO_REQUESTS, SOURCE
from schemas.jobs import JobStarted
from schemas.requests import JobRequest, JobRequestResult, JobRequestStatus
from tests.integration.operator.conftest import Sim
from tests.integration.tap import Tap

pytestmark = pytest.mark.integration


async def test_a_virtual_env_refuses_job_requests(sim: Sim) -> None:
    answers = Tap(sim.settings, sim.env, (JOB_REQUESTS,))
    await answers.start()
    try:
        await sim.start()
        await sim.producer.publish(
            JobRequest(
                env=sim.env,
                source="searcher-test",
                request_id="req-1",
                name="trial-1",
                document={"kind": "TrainingJob", "spec": {"roles": {}}},
            )
        )
        refused = await answers.until(
            lambda: next(iter(answers.of(JobRequestResult, "trial-1")), None), "an answer"
        )
        assert (refused.status, refused.reason) == (JobRequestStatus.REFUSED, NO_REQUESTS)
        assert refused.source == SOURCE and refused.request_id == "req-1"
        assert not sim.tap.of(JobStarted)
    finally:
        await answers.stop()
