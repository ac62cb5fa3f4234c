"""SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), alone and over TLS: the services' clients
log in and work (tansu behind a SASL front, see front.py: tansu 0.6.0 can refuse but not
accept a login); a wrong password is one line, met at once, from the front and from
tansu's own SASL."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import TopicReader
from dlrover_events.bus.topics import env_topics
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import BusRefused
from dlrover_events.runtime.embedded import Broker
from dlrover_events.settings import Settings
from schemas import JobMeta, RuntimeSample
from schemas.control import EnvMode
from tests.conftest import unique_env
from tests.integration.kafka.conftest import Pki, environ, sasl, secure_settings, tls
from tests.integration.kafka.front import KafkaFront
from tests.integration.kafka.test_kafka_tls import an_env, round_trip

pytestmark = pytest.mark.integration

CLI = str(Path(sys.executable).parent / "dlrover-events")


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_services_log_in_with_each_mechanism(
    sasl_front: KafkaFront, pg_dsn: str, mechanism: str
) -> None:
    settings = secure_settings(sasl_front.bootstrap_servers, pg_dsn, **sasl(mechanism))
    async with an_env(settings) as env:
        await round_trip(settings, env, count=10)


async def test_sasl_over_tls_with_a_password_file(
    sasl_ssl_front: KafkaFront, pki: Pki, pg_dsn: str, tmp_path: Path
) -> None:
    password = tmp_path / "password"
    password.write_text("s3cret-trainer\n")  # as `echo` writes a mounted Secret
    settings = secure_settings(
        sasl_ssl_front.bootstrap_servers,
        pg_dsn,
        **tls(pki)
        | sasl("SCRAM-SHA-512", "trainer", security_protocol="SASL_SSL", sasl_password=None),
        sasl_password_file=password,
    )
    async with an_env(settings) as env:
        await round_trip(settings, env, count=10)


async def test_a_wrong_password_is_one_line(sasl_front: KafkaFront, pg_dsn: str) -> None:
    before = len(sasl_front.refused)
    settings = secure_settings(
        sasl_front.bootstrap_servers, pg_dsn, **sasl(sasl_password="not-the-password")
    )
    with pytest.raises(BusRefused) as refused:
        async with TopicReader(settings, ["dlrover.control"], client_id="t", require=False):
            pass
    assert str(refused.value).startswith(
        f"Kafka at {sasl_front.bootstrap_servers} refused user 'brain' (SCRAM-SHA-512): "
        "wrong username or password"
    )
    assert "\n" not in str(refused.value)
    assert sasl_front.refused[before:] and set(sasl_front.refused[before:]) == {"SCRAM-SHA-512"}


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_tansus_own_sasl_refusal_is_one_line(
    auth_broker: Broker, pg_dsn: str, mechanism: str
) -> None:
    """tansu's SCRAM refuses every login (its memory storage keeps no credentials): what a
    real broker answers to a wrong password."""
    settings = secure_settings(auth_broker.bootstrap_servers, pg_dsn, **sasl(mechanism))
    with pytest.raises(BusRefused) as refused:
        async with Producer(settings):
            pass
    assert str(refused.value).startswith(
        f"Kafka at {auth_broker.bootstrap_servers} refused user 'brain' ({mechanism}): "
        "wrong username or password"
    )


async def test_a_mechanism_the_broker_lacks_is_named(
    auth_broker: Broker, broker: Broker, pg_dsn: str
) -> None:
    # a listener without SASL answers the handshake with an error (as Kafka does)
    settings = secure_settings(broker.bootstrap_servers, pg_dsn, **sasl("SCRAM-SHA-512"))
    with pytest.raises(BusRefused) as refused:
        async with Producer(settings):
            pass
    assert str(refused.value).startswith(
        f"Kafka at {broker.bootstrap_servers} does not accept SASL SCRAM-SHA-512"
    )
    # tansu has no PLAIN, and hangs up instead of answering with the mechanisms it has
    settings = secure_settings(auth_broker.bootstrap_servers, pg_dsn, **sasl("PLAIN"))
    with pytest.raises(BusRefused) as refused:
        async with Producer(settings):
            pass
    assert str(refused.value) == (
        f"Kafka at {auth_broker.bootstrap_servers} closed the connection at the SASL PLAIN "
        "login: does it accept PLAIN?"
    )


async def publish(settings: Settings, env: str, count: int) -> None:
    async with Producer(settings) as producer:
        await producer.publish_many(
            [
                RuntimeSample(env=env, job=JobMeta(uuid="job"), global_step=i, speed=1.0)
                for i in range(count)
            ]
        )


def test_the_cli_over_sasl_ssl_and_a_wrong_password(
    sasl_ssl_front: KafkaFront, pki: Pki, pg_dsn: str
) -> None:
    settings = secure_settings(
        sasl_ssl_front.bootstrap_servers,
        pg_dsn,
        **tls(pki) | sasl(security_protocol="SASL_SSL"),
    )
    env = unique_env("cli")

    def run(*args: str, s: Settings = settings) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [CLI, *args], env=environ(s), capture_output=True, text=True, timeout=120
        )

    created = run("env", "create", env)
    assert created.returncode == 0, created.stderr
    try:
        asyncio.run(publish(settings, env, 3))
        tail = run("tail", "--env", env, "--from-beginning", "--limit", "3", "--json")
        assert tail.returncode == 0, tail.stderr
        assert [orjson.loads(line)["global_step"] for line in tail.stdout.splitlines()] == [
            0,
            1,
            2,
        ]
    finally:
        assert run("env", "delete", env, "--force").returncode == 0
    wrong = settings.with_overrides(sasl_password="guess")
    refused = run("env", "create", unique_env("cli"), s=wrong)
    assert refused.returncode == 2
    assert (
        refused.stderr
        == (
            f"error: Kafka at {sasl_ssl_front.bootstrap_servers} refused user 'brain' "
            "(SCRAM-SHA-512): wrong username or password "
        )
        + refused.stderr.split("wrong username or password ", 1)[1]
    )
    assert refused.stderr.count("\n") == 1, refused.stderr


async def test_env_create_over_sasl(sasl_front: KafkaFront, pg_dsn: str) -> None:
    settings = secure_settings(sasl_front.bootstrap_servers, pg_dsn, **sasl("SCRAM-SHA-256"))
    registry = EnvRegistry(settings, pg_dsn)
    env = unique_env("sasl")
    await registry.create(env, EnvMode.VIRTUAL, partitions=1)
    try:
        async with TopicReader(settings, env_topics(env), client_id="t") as reader:
            assert {tp.topic for tp in reader.partitions} == set(env_topics(env))
    finally:
        await registry.delete(env, force=True)
