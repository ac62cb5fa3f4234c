"""The evaluator service folds an env's topics and reports KPIs to the topic and Postgres."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import EVAL_REPORTS, topic
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from schemas import EvaluationReport, JobCompleted, JobMeta, JobStarted, JobSubmitted, decode
from schemas.jobs import RoleSpec
from streams.evaluators.service import ledger_of, run
from tests.conftest import EnvFactory

pytestmark = pytest.mark.integration
T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def test_reports_reach_the_topic_and_postgres(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    async with Producer(settings) as producer:
        for i, jct in enumerate((600, 1200)):
            job = JobMeta(uuid=f"job-{i}")
            await producer.publish(
                JobSubmitted(
                    env=env,
                    job=job,
                    occurred_at=T0,
                    roles={"worker": RoleSpec(replicas=2, gpu_num=1)},
                )
            )
            await producer.publish(JobStarted(env=env, job=job, occurred_at=T0))
            await producer.publish(
                JobCompleted(env=env, job=job, occurred_at=T0 + timedelta(seconds=jct))
            )
    assert (await ledger_of(settings, env)).jobs.keys() == {"job-0", "job-1"}

    ctx = ServiceContext(settings, env, pg_dsn)
    task = asyncio.create_task(run(ctx, interval_s=0.5))
    await asyncio.wait_for(ctx.ready.wait(), 20)
    try:
        jct_reports: list[EvaluationReport] = []
        for _ in range(60):
            records = await read_topic(settings, topic(env, EVAL_REPORTS))
            jct_reports = [
                e
                for r in records
                if isinstance(e := decode(r.value), EvaluationReport) and e.evaluator == "jct"
            ]
            if jct_reports and jct_reports[-1].jobs == 2:
                break
            await asyncio.sleep(0.25)
    finally:
        ctx.stop.set()
        await asyncio.wait_for(task, 20)
    last = jct_reports[-1]
    assert last.metrics["jct_mean_s"] == pytest.approx(900)
    assert last.metrics["jobs_completed"] == 2
    store = await EnvStore.open(pg_dsn, env)
    async with store:
        rows = await store.fetch(
            "SELECT metrics FROM evaluation_results WHERE evaluator = 'gpu_hours'"
        )
    assert rows
    assert rows[-1]["metrics"]["gpu_hours"] == pytest.approx((2 * 600 + 2 * 1200) / 3600)
