"""Services on a secured bus: the brain (its faust app has credentials objects of its own)
decides over SASL_SSL; a service command given a wrong password says so in one line and
stops (exit 2), as `up` stops for a service that fails that way (not retried)."""

from __future__ import annotations

import asyncio

import pytest

from dlrover_events.bus.topics import SCALE_PLANS, topic
from dlrover_events.errors import BusRefused, BusUnavailable
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.runtime.supervisor import is_fatal
from dlrover_events.store import EnvStore
from schemas.plans import ScalePlan
from streams.brain.runtime.app import service
from tests.integration.brain.test_brain_service import _publish_oom_job
from tests.integration.brain.workload import plans_on
from tests.integration.kafka.conftest import Pki, environ, sasl, secure_settings, tls
from tests.integration.kafka.front import KafkaFront
from tests.integration.kafka.test_kafka_sasl import CLI
from tests.integration.kafka.test_kafka_tls import an_env

pytestmark = pytest.mark.integration


async def test_the_brain_decides_over_sasl_ssl(
    sasl_ssl_front: KafkaFront, pki: Pki, pg_dsn: str
) -> None:
    settings = secure_settings(
        sasl_ssl_front.bootstrap_servers,
        pg_dsn,
        **tls(pki) | sasl("SCRAM-SHA-512", security_protocol="SASL_SSL"),
    )
    async with an_env(settings) as env:
        want = await _publish_oom_job(settings, env, "job-secure")
        ctx = ServiceContext(settings, env, pg_dsn)
        task = asyncio.create_task(service.run(ctx))
        try:
            async with asyncio.timeout(60):
                await ctx.ready.wait()
            async with await EnvStore.open(pg_dsn, env) as store:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 60
                query = "SELECT plan_id FROM scale_plans"
                while want not in {r["plan_id"] for r in await store.fetch(query)}:
                    assert loop.time() < deadline, "no ScalePlan recorded"
                    await asyncio.sleep(0.2)
        finally:
            ctx.stop.set()
            async with asyncio.timeout(30):
                await task
        published = await plans_on(settings, topic(env, SCALE_PLANS))
        assert want in {p.plan_id for p in published if isinstance(p, ScalePlan)}


async def test_a_service_command_with_a_wrong_password_says_so_and_stops(
    sasl_front: KafkaFront, pg_dsn: str
) -> None:
    good = secure_settings(sasl_front.bootstrap_servers, pg_dsn, **sasl())
    wrong = good.with_overrides(sasl_password="guess")
    async with an_env(good) as env:
        proc = await asyncio.create_subprocess_exec(
            CLI,
            "brain",
            "--env",
            env,
            env=environ(wrong),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(120):
            _, err = await proc.communicate()
    stderr = err.decode()
    assert proc.returncode == 2, stderr
    assert stderr.splitlines()[-1].startswith(
        f"error: Kafka at {sasl_front.bootstrap_servers} refused user 'brain' (SCRAM-SHA-512)"
    ), stderr
    assert "Traceback" not in stderr


def test_up_does_not_retry_a_refused_service() -> None:
    assert is_fatal(BusRefused("Kafka at x refused user 'u' (PLAIN)"))
    assert not is_fatal(BusUnavailable("Kafka away"))
