"""The connection arguments every Kafka client is built with, from Settings: one place, and
every client of the project uses it (a client built beside it would connect without TLS
or SASL: checked over the source)."""

from __future__ import annotations

import re
import ssl
from pathlib import Path

import faust
import pytest

from dlrover_events.bus.kafka_client import kafka_connection, ssl_context
from dlrover_events.settings import Settings, SettingsError
from streams.brain.runtime.faust_glue import broker_credentials

REPO = Path(__file__).resolve().parents[2]
CLIENT = re.compile(r"AIOKafka(Producer|Consumer|AdminClient|Client)\(")


def test_plaintext_is_only_the_address() -> None:
    assert kafka_connection(Settings(bootstrap_servers="k:9092")) == {
        "bootstrap_servers": "k:9092",
        "security_protocol": "PLAINTEXT",
    }


def test_sasl_reads_the_password_file_at_each_connection(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("first\n")
    settings = Settings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="brain",
        sasl_password_file=secret,
    )
    args = kafka_connection(settings)
    assert args["sasl_mechanism"] == "SCRAM-SHA-256" and args["sasl_plain_username"] == "brain"
    assert args["sasl_plain_password"] == "first"
    secret.write_text("rotated")
    assert kafka_connection(settings)["sasl_plain_password"] == "rotated"
    assert "ssl_context" not in args
    secret.unlink()
    with pytest.raises(SettingsError, match=r"^cannot read DLROVER_EVENTS_SASL_PASSWORD_FILE "):
        kafka_connection(settings)


def test_tls_context_trusts_the_system_or_the_given_ca_and_is_shared(tmp_path: Path) -> None:
    system = ssl_context(Settings(security_protocol="SSL"))
    assert system.verify_mode == ssl.CERT_REQUIRED and system.check_hostname
    assert system is ssl_context(Settings(security_protocol="SSL")), "built once"
    unchecked = ssl_context(Settings(security_protocol="SSL", ssl_check_hostname=False))
    assert not unchecked.check_hostname and unchecked.verify_mode == ssl.CERT_REQUIRED
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(SettingsError, match=r"^DLROVER_EVENTS_SSL_CAFILE .* cannot be used"):
        ssl_context(Settings(security_protocol="SSL", ssl_cafile=bad))


def test_faust_gets_the_same_credentials() -> None:
    assert broker_credentials(kafka_connection(Settings())) is None
    tls = broker_credentials(kafka_connection(Settings(security_protocol="SSL")))
    assert isinstance(tls, faust.SSLCredentials) and isinstance(tls.context, ssl.SSLContext)
    both = broker_credentials(
        kafka_connection(
            Settings(
                security_protocol="SASL_SSL",
                sasl_mechanism="SCRAM-SHA-512",
                sasl_username="brain",
                sasl_password="pw",
            )
        )
    )
    assert isinstance(both, faust.SASLCredentials)
    assert (both.username, both.password, both.mechanism.value) == ("brain", "pw", "SCRAM-SHA-512")
    assert both.protocol.value == "SASL_SSL" and both.ssl_context is not None
    plain = broker_credentials(
        kafka_connection(
            Settings(
                security_protocol="SASL_PLAINTEXT",
                sasl_mechanism="PLAIN",
                sasl_username="u",
                sasl_password="p",
            )
        )
    )
    assert isinstance(plain, faust.SASLCredentials) and plain.protocol.value == "SASL_PLAINTEXT"


def test_every_kafka_client_of_the_project_is_built_with_kafka_connection() -> None:
    """Each `AIOKafka...(` call of the code spreads `kafka_connection(...)` (or the
    `connection` made from it) into its arguments."""
    offenders = []
    for package in ("dlrover_events", "streams", "handlers", "sdk/dlrover_events"):
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text()
            for match in CLIENT.finditer(text):
                call = text[match.end() : match.end() + 400]
                if "**kafka_connection(" not in call and "**connection" not in call:
                    line = text.count("\n", 0, match.start()) + 1
                    offenders.append(f"{path.relative_to(REPO)}:{line}")
    assert offenders == []
