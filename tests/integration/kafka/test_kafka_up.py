"""`up` against an external Kafka over SASL_SSL, as a platform would run it: every service
it starts connects with the security settings of its environment, and an event published
over the same settings is archived."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.store import EnvStore
from schemas import JobMeta, JobSubmitted
from tests.integration.kafka.conftest import Pki, environ, sasl, secure_settings, tls
from tests.integration.kafka.front import KafkaFront
from tests.integration.test_up import Up, up_environ

pytestmark = pytest.mark.integration


async def test_up_runs_its_services_over_sasl_ssl(
    sasl_ssl_front: KafkaFront, pki: Pki, own_pg: str, tmp_path: Path
) -> None:
    # a registry of its own: the real env `up` makes takes no other test's place
    pg_dsn = own_pg
    settings = secure_settings(
        sasl_ssl_front.bootstrap_servers,
        pg_dsn,
        **tls(pki) | sasl("SCRAM-SHA-512", security_protocol="SASL_SSL"),
    )
    security = {k: v for k, v in environ(settings).items() if k.startswith("DLROVER_EVENTS_")}
    up = Up(up_environ(pg_dsn, tmp_path, **security))
    try:
        await up.started()
        assert "tansu" not in up.stdout, "an external bus: no embedded broker"
        await up.wait_for(lambda: up.get("/readyz")[0] == 200, "/readyz said ready")
        real = await EnvRegistry(settings, pg_dsn).real()
        assert real is not None
        event = JobSubmitted(env=real.name, job=JobMeta(uuid="job-up-sasl"))
        async with Producer(settings) as producer:
            await producer.publish(event)
        query = "SELECT 1 FROM events_archive WHERE event_id = $1"
        async with await EnvStore.open(pg_dsn, real.name) as store:
            for _ in range(200):
                if rows := await store.fetch(query, event.event_id):
                    break
                await asyncio.sleep(0.1)
            assert rows, "the archiver of `up` stored the event it read over SASL_SSL"
    finally:
        rc = await up.stop()
    assert rc == 0, up.stderr
