"""Kafka security settings: a combination that cannot connect is one settings error, named
as the user sets it (DLROVER_EVENTS_*), before any client tries."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover_events.errors import UserError
from dlrover_events.settings import Settings, SettingsError, load_settings


@pytest.fixture(autouse=True)
def _no_settings_from_the_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "none.toml"  # (a config file named must be there)
    empty.write_text("")
    monkeypatch.setenv("DLROVER_EVENTS_CONFIG", str(empty))


def _error(monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    for name, value in env.items():
        monkeypatch.setenv(f"DLROVER_EVENTS_{name.upper()}", value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert isinstance(caught.value, UserError)
    text = str(caught.value)
    assert "\n" not in text
    return text


def test_defaults_are_plaintext_without_credentials() -> None:
    s = Settings()
    assert s.security_protocol == "PLAINTEXT"
    assert s.sasl_mechanism is None and s.ssl_cafile is None and s.ssl_check_hostname
    assert s.create_topics


def test_sasl_needs_mechanism_user_and_password(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _error(monkeypatch, security_protocol="SASL_SSL")
    assert text == (
        "invalid settings: DLROVER_EVENTS_SECURITY_PROTOCOL=SASL_SSL needs "
        "DLROVER_EVENTS_SASL_MECHANISM, DLROVER_EVENTS_SASL_USERNAME, "
        "DLROVER_EVENTS_SASL_PASSWORD or DLROVER_EVENTS_SASL_PASSWORD_FILE"
    )
    text = _error(monkeypatch, sasl_mechanism="SCRAM-SHA-512", sasl_username="brain")
    assert text.endswith("needs DLROVER_EVENTS_SASL_PASSWORD or DLROVER_EVENTS_SASL_PASSWORD_FILE")


def test_credentials_for_a_protocol_without_them_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert "DLROVER_EVENTS_SASL_USERNAME is set but" in _error(monkeypatch, sasl_username="x")
    monkeypatch.delenv("DLROVER_EVENTS_SASL_USERNAME")
    text = _error(
        monkeypatch,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="u",
        sasl_password="p",
        ssl_cafile="/ca.pem",
    )
    assert "DLROVER_EVENTS_SSL_CAFILE is set but" in text and "uses no TLS" in text


def test_one_password_source_and_key_needs_cert(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _error(
        monkeypatch,
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password="p",
        sasl_password_file="/run/secrets/p",
    )
    assert "not both" in text
    monkeypatch.delenv("DLROVER_EVENTS_SASL_PASSWORD_FILE")
    assert "SSL_KEYFILE needs DLROVER_EVENTS_SSL_CERTFILE" in _error(monkeypatch, ssl_keyfile="/k")


def test_unknown_protocol_and_mechanism_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _error(monkeypatch, security_protocol="TLS")
    assert text.startswith("invalid settings: DLROVER_EVENTS_SECURITY_PROTOCOL: Input should be")
    monkeypatch.setenv("DLROVER_EVENTS_SECURITY_PROTOCOL", "SASL_SSL")
    text = _error(monkeypatch, sasl_mechanism="GSSAPI", sasl_username="u", sasl_password="p")
    assert "DLROVER_EVENTS_SASL_MECHANISM: Input should be 'PLAIN'" in text


def test_a_complete_sasl_ssl_setup_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "SECURITY_PROTOCOL": "SASL_SSL",
        "SASL_MECHANISM": "SCRAM-SHA-256",
        "SASL_USERNAME": "brain",
        "SASL_PASSWORD_FILE": "/run/secrets/kafka/password",
        "SSL_CAFILE": "/run/secrets/kafka-ca/ca.crt",
        "SSL_CHECK_HOSTNAME": "false",
        "RETENTION_METRICS_MS": "86400000",
    }.items():
        monkeypatch.setenv(f"DLROVER_EVENTS_{name}", value)
    s = load_settings()
    assert s.sasl_password is None and s.sasl_password_file == Path("/run/secrets/kafka/password")
    assert s.ssl_check_hostname is False and s.retention_metrics_ms == 86_400_000
