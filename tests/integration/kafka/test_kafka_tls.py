"""Every client of the project over TLS (tansu behind a TLS front, see front.py): the bus's
producer and consumer, the topic reader, `env create` in process and as a command; and
each TLS mistake is one error that names the setting to change."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dlrover_events.bus.consumer import Consumer, Received
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import TopicReader
from dlrover_events.bus.topics import JOB_METRICS, env_topics, topic
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import BusRefused
from dlrover_events.runtime.embedded import Broker
from dlrover_events.settings import Settings, SettingsError
from schemas import JobMeta, RuntimeSample
from schemas.control import EnvMode
from tests.conftest import unique_env
from tests.integration.kafka.conftest import Pki, environ, secure_settings, tls
from tests.integration.kafka.front import KafkaFront

pytestmark = pytest.mark.integration


@contextlib.asynccontextmanager
async def an_env(settings: Settings) -> AsyncIterator[str]:
    assert settings.pg_dsn is not None
    registry = EnvRegistry(settings, settings.pg_dsn)
    name = unique_env("tls")
    await registry.create(name, EnvMode.VIRTUAL, partitions=settings.partitions)
    try:
        yield name
    finally:
        await registry.delete(name, force=True)


async def round_trip(settings: Settings, env: str, count: int = 20) -> list[Received]:
    """Publish `count` samples with the bus's producer, read them with a group consumer
    and with the group-less topic reader; returns what the consumer got."""
    events = [
        RuntimeSample(env=env, job=JobMeta(uuid=f"job-{i % 3}"), global_step=i, speed=1.0)
        for i in range(count)
    ]
    async with Producer(settings) as producer:
        await producer.publish_many(events)
    got: list[Received] = []

    async def handle(batch: list[Received]) -> None:
        got.extend(batch)

    async with Consumer(settings, env, [JOB_METRICS], "secured", handle) as consumer:
        async with asyncio.timeout(30):
            while len(got) < count:
                await consumer.poll(timeout_ms=300)
    async with TopicReader(settings, [topic(env, JOB_METRICS)], client_id="t") as reader:
        read = await reader.read_to_end(expect=count)
    assert sorted(e.event_id for e in events) == sorted(r.event.event_id for r in got)
    assert len(read) == count
    return got


async def test_services_publish_and_read_over_tls(
    tls_front: KafkaFront, pki: Pki, pg_dsn: str
) -> None:
    settings = secure_settings(tls_front.bootstrap_servers, pg_dsn, **tls(pki))
    async with an_env(settings) as env:
        await round_trip(settings, env)


async def test_mutual_tls_needs_the_client_certificate(
    mtls_front: KafkaFront, pki: Pki, pg_dsn: str
) -> None:
    without = secure_settings(mtls_front.bootstrap_servers, pg_dsn, **tls(pki))
    with pytest.raises(BusRefused) as refused:
        async with Producer(without):
            pass
    text = str(refused.value)
    assert text.startswith(f"TLS handshake with Kafka at {mtls_front.bootstrap_servers} failed")
    assert "\n" not in text
    with_cert = secure_settings(
        mtls_front.bootstrap_servers,
        pg_dsn,
        **tls(pki, ssl_certfile=pki.client_cert, ssl_keyfile=pki.client_key),
    )
    async with an_env(with_cert) as env:
        await round_trip(with_cert, env, count=5)


async def test_an_untrusted_certificate_is_one_error_naming_the_ca_setting(
    tls_front: KafkaFront, pki: Pki, pg_dsn: str
) -> None:
    settings = secure_settings(
        tls_front.bootstrap_servers, pg_dsn, **tls(pki, ssl_cafile=pki.other_ca)
    )
    with pytest.raises(BusRefused) as refused:
        async with Producer(settings):
            pass
    text = str(refused.value)
    assert text.startswith(f"TLS: Kafka at {tls_front.bootstrap_servers} has a certificate")
    assert "set DLROVER_EVENTS_SSL_CAFILE" in text and "\n" not in text


async def test_the_hostname_check_can_be_turned_off(
    named_front: KafkaFront, pki: Pki, pg_dsn: str
) -> None:
    checked = secure_settings(named_front.bootstrap_servers, pg_dsn, **tls(pki))
    with pytest.raises(BusRefused) as refused:
        async with TopicReader(checked, ["dlrover.control"], client_id="t", require=False):
            pass
    assert "DLROVER_EVENTS_SSL_CHECK_HOSTNAME=false" in str(refused.value)
    unchecked = checked.with_overrides(ssl_check_hostname=False)
    async with an_env(unchecked) as env:
        await round_trip(unchecked, env, count=5)


async def test_tls_to_a_plaintext_listener_is_refused_at_once(
    broker: Broker, pki: Pki, pg_dsn: str
) -> None:
    # A request timeout longer than the test's own: waiting for it would fail the test.
    settings = secure_settings(broker.bootstrap_servers, pg_dsn, **tls(pki)).with_overrides(
        request_timeout_ms=3_600_000
    )
    with pytest.raises(BusRefused) as refused:
        async with Producer(settings):
            pass
    assert str(refused.value) == (
        f"Kafka at {broker.bootstrap_servers} answers in plaintext but "
        "DLROVER_EVENTS_SECURITY_PROTOCOL=SSL: is that its TLS listener?"
    )


async def test_plaintext_to_a_tls_listener_names_the_protocol(
    tls_front: KafkaFront, pg_dsn: str
) -> None:
    settings = secure_settings(tls_front.bootstrap_servers, pg_dsn)
    with pytest.raises(BusRefused) as refused:
        async with Producer(settings):
            pass
    assert str(refused.value) == (
        f"Kafka at {tls_front.bootstrap_servers} speaks TLS but "
        "DLROVER_EVENTS_SECURITY_PROTOCOL=PLAINTEXT: set SSL (or SASL_SSL)"
    )


async def test_an_unreadable_ca_file_is_a_settings_error(pki: Pki, pg_dsn: str) -> None:
    settings = secure_settings(
        "127.0.0.1:1", pg_dsn, **tls(pki, ssl_cafile=pki.ca.with_name("missing.pem"))
    )
    with pytest.raises(SettingsError, match=r"^cannot read DLROVER_EVENTS_SSL_CAFILE .*missing"):
        Producer(settings)


def test_env_create_as_a_command_over_tls(tls_front: KafkaFront, pki: Pki, pg_dsn: str) -> None:
    settings = secure_settings(tls_front.bootstrap_servers, pg_dsn, **tls(pki))
    env = unique_env("cli")
    cmd = [str(Path(sys.executable).parent / "dlrover-events"), "env"]
    created = subprocess.run(
        [*cmd, "create", env], env=environ(settings), capture_output=True, text=True, timeout=120
    )
    assert created.returncode == 0, created.stderr
    try:

        async def topics() -> list[str]:
            reader = TopicReader(settings, env_topics(env), client_id="t")
            async with reader:
                return [tp.topic for tp in reader.partitions]

        assert set(asyncio.run(topics())) == set(env_topics(env))
    finally:
        deleted = subprocess.run(
            [*cmd, "delete", env, "--force"],
            env=environ(settings),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert deleted.returncode == 0, deleted.stderr
    refused = subprocess.run(
        [*cmd, "create", unique_env("cli")],
        env=environ(settings.with_overrides(ssl_cafile=pki.other_ca)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith(f"error: TLS: Kafka at {tls_front.bootstrap_servers}")
