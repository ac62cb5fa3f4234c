"""The brain's metrics, as `up` serves them from the registry the service is given."""

from __future__ import annotations

import asyncio

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import JOB_EVENTS, topic
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from schemas.jobs import JobMeta, JobStarted
from streams.brain.runtime.app import service
from tests.conftest import EnvFactory
from tests.integration.brain.workload import oom, submitted, wait_for

pytestmark = pytest.mark.integration


async def test_the_brain_counts_what_it_decides_and_publishes(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env(partitions=1)).name
    job = JobMeta(uuid="job-metrics")
    async with Producer(settings) as producer:
        await producer.publish_many(
            [submitted(env, job), JobStarted(env=env, job=job), oom(env, job, 1, node=0)]
        )
        await producer.send_raw(topic(env, JOB_EVENTS), b"not json", b"job-metrics")
    ctx = ServiceContext(settings, env, pg_dsn)
    task = asyncio.create_task(service.run(ctx))

    def value(name: str, **labels: str) -> float:
        return ctx.metrics.get_sample_value(name, {"env": env, **labels}) or 0.0

    try:
        await wait_for(
            lambda: (
                value("dlrover_events_brain_plans_total", kind="scale") >= 1
                and value("dlrover_events_brain_dead_letters_total", kind="malformed") >= 1
                and value("dlrover_events_brain_checkpoint_duration_seconds_count") >= 1
            ),
            timeout_s=60,
            what="a ScalePlan, a dead letter and a checkpoint counted",
        )
    finally:
        ctx.stop.set()
        async with asyncio.timeout(30):
            await task
    assert value("dlrover_events_brain_plans_total", kind="optimize") >= 1
    assert value("dlrover_events_brain_decisions_total") >= 1
    assert value("dlrover_events_brain_events_total") == 4  # the dead letter included
    assert value("dlrover_events_brain_plan_latency_seconds_count") >= 2
    # every plan here has an input record as its cause, and that record a timestamp
    assert value("dlrover_events_brain_plan_publication_latency_seconds_count") == value(
        "dlrover_events_brain_plan_latency_seconds_count"
    )
    lag = {"topic": topic(env, JOB_EVENTS), "partition": "0"}
    assert (
        ctx.metrics.get_sample_value(
            "dlrover_events_brain_consumer_lag_records", {"env": env, **lag}
        )
        == 0.0
    ), "every record decided: no lag"
