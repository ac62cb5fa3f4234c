"""Secured buses for the Kafka security tests: a throwaway PKI, tansu with its own SASL
(which refuses everybody, see front.py), and tansu behind a TLS and/or SASL front."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dlrover_events.runtime.embedded import Broker, free_port
from dlrover_events.settings import Settings
from tests.conftest import ARTIFACTS
from tests.integration.kafka.front import KafkaFront

USERS = {"brain": "s3cret-brain", "trainer": "s3cret-trainer"}


@dataclass(frozen=True)
class Pki:
    """PEM files: a CA and what it signed, and a CA nobody trusts."""

    ca: Path
    server_cert: Path
    server_key: Path
    #: a server certificate for `kafka.example` only: 127.0.0.1 does not match it
    named_cert: Path
    named_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    sans: list[x509.GeneralName] | None = None,
    usage: list[x509.ObjectIdentifier] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
    else:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(directory: Path, name: str, cert: x509.Certificate, key: Any = None) -> Path:
    path = directory / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        (directory / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return path


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca_key = _key()
    ca = _cert("dlrover-events test CA", ca_key, None, ca=True)
    other = _cert("a CA nobody trusts", _key(), None, ca=True)
    local: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
    ]
    only_named: list[x509.GeneralName] = [x509.DNSName("kafka.example")]
    server = ("server", _key(), ca, ca_key, local, ExtendedKeyUsageOID.SERVER_AUTH)
    named = ("named", _key(), ca, ca_key, only_named, server[5])
    client = ("client", _key(), ca, ca_key, None, ExtendedKeyUsageOID.CLIENT_AUTH)
    for name, key, issuer, issuer_key, sans, usage in (server, named, client):
        cert = _cert(name, key, (issuer.subject, issuer_key), sans=sans, usage=[usage])
        _write(d, name, cert, key)
    return Pki(
        ca=_write(d, "ca", ca),
        server_cert=d / "server.pem",
        server_key=d / "server.key",
        named_cert=d / "named.pem",
        named_key=d / "named.key",
        client_cert=d / "client.pem",
        client_key=d / "client.key",
        other_ca=_write(d, "other-ca", other),
    )


def server_tls(cert: Path, key: Path, *, client_ca: Path | None = None) -> ssl.SSLContext:
    """A broker's TLS: its certificate, and with `client_ca` clients must show one."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


@contextlib.contextmanager
def fronted(
    *, tls: ssl.SSLContext | None = None, users: dict[str, str] | None = None
) -> Iterator[KafkaFront]:
    """A tansu of its own (it must advertise the front's address) behind a front."""
    port = free_port()
    broker = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs", advertised=f"127.0.0.1:{port}")
    broker.start()
    front = KafkaFront(("127.0.0.1", broker.port), port=port, tls=tls, users=users)
    try:
        front.start()
        yield front
    finally:
        front.stop()
        broker.stop()


@pytest.fixture(scope="session")
def tls_front(pki: Pki) -> Iterator[KafkaFront]:
    with fronted(tls=server_tls(pki.server_cert, pki.server_key)) as front:
        yield front


@pytest.fixture(scope="session")
def mtls_front(pki: Pki) -> Iterator[KafkaFront]:
    """TLS that wants a client certificate signed by the test CA."""
    with fronted(tls=server_tls(pki.server_cert, pki.server_key, client_ca=pki.ca)) as front:
        yield front


@pytest.fixture(scope="session")
def named_front(pki: Pki) -> Iterator[KafkaFront]:
    """TLS with a certificate for kafka.example only (reached as 127.0.0.1)."""
    with fronted(tls=server_tls(pki.named_cert, pki.named_key)) as front:
        yield front


@pytest.fixture(scope="session")
def sasl_front() -> Iterator[KafkaFront]:
    with fronted(users=USERS) as front:
        yield front


@pytest.fixture(scope="session")
def sasl_ssl_front(pki: Pki) -> Iterator[KafkaFront]:
    with fronted(tls=server_tls(pki.server_cert, pki.server_key), users=USERS) as front:
        yield front


@pytest.fixture(scope="session")
def auth_broker() -> Iterator[Broker]:
    """tansu with its own SASL on: every login is refused (see front.py)."""
    b = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs", authentication=True)
    b.start()
    yield b
    b.stop()


def secure_settings(servers: str, pg_dsn: str, **security: Any) -> Settings:
    """The test settings (short group timeouts) for a secured bus."""
    return Settings(
        bootstrap_servers=servers,
        pg_dsn=pg_dsn,
        partitions=2,
        request_timeout_ms=10000,
        session_timeout_ms=2000,
        heartbeat_interval_ms=300,
        **security,
    )


def tls(pki: Pki, **more: Any) -> dict[str, Any]:
    return {"security_protocol": "SSL", "ssl_cafile": pki.ca, **more}


def sasl(mechanism: str = "SCRAM-SHA-512", user: str = "brain", **more: Any) -> dict[str, Any]:
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_username": user,
        "sasl_password": USERS.get(user, "no such user"),
        **more,
    }


def environ(settings: Settings) -> dict[str, str]:
    """A process's DLROVER_EVENTS_* variables for `settings` (bus, Postgres, security),
    as a pod or a platform engineer would set them."""
    names = (
        "bootstrap_servers",
        "pg_dsn",
        "session_timeout_ms",
        "heartbeat_interval_ms",
        "request_timeout_ms",
        "security_protocol",
        "sasl_mechanism",
        "sasl_username",
        "sasl_password",
        "sasl_password_file",
        "ssl_cafile",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_check_hostname",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLROVER_EVENTS_")}
    for name in names:
        value = getattr(settings, name)
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        env[f"DLROVER_EVENTS_{name.upper()}"] = (
            str(value).lower() if isinstance(value, bool) else str(value)
        )
    return env
