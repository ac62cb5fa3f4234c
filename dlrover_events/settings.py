"""All settings in one place: environment variables (DLROVER_EVENTS_*), then a TOML file
(``DLROVER_EVENTS_CONFIG`` or ./dlrover-events.toml), then defaults.

Defaults suit the embedded stack: everything on 127.0.0.1, and the broker features tansu
lacks (idempotent producer, transactions) off. Correctness comes from idempotent effects.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

CONFIG_FILE_ENV = "DLROVER_EVENTS_CONFIG"
DEFAULT_CONFIG_FILE = Path("dlrover-events.toml")


def _config_file() -> Path:
    return Path(os.environ.get(CONFIG_FILE_ENV, DEFAULT_CONFIG_FILE))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DLROVER_EVENTS_", extra="ignore")

    # Kafka
    bootstrap_servers: str = "127.0.0.1:9092"
    client_id: str = "dlrover-events"
    partitions: int = Field(default=3, ge=1, description="partitions of a new env's topics")
    replication_factor: int = Field(default=1, ge=1)
    enable_idempotence: bool = False  # tansu has no idempotent producer
    transactional_id: str | None = None  # tansu has no transactions
    consumer_batch: int = Field(default=2000, ge=1, description="max records per fetch")
    request_timeout_ms: int = Field(default=15000, ge=1000)
    # tansu delays a group join by about half the session timeout; short timeouts make
    # tests and small deployments start faster, at the price of more heartbeats.
    session_timeout_ms: int = Field(default=10000, ge=1000)
    heartbeat_interval_ms: int = Field(default=3000, ge=100)

    # Postgres
    pg_dsn: str | None = Field(
        default=None, description="unset: the machine's 127.0.0.1:5432 if it answers, else embedded"
    )
    pg_database: str = Field(default="dlrover_events", description="database `up` creates")
    pg_pool_max: int = Field(default=10, ge=1)

    # Embedded stack
    host: str = "127.0.0.1"
    broker_port: int = 9092
    data_dir: Path = Path(".dlrover-events")
    default_env: str = "prod"
    # Supervision by `up`: its /metrics, /healthz and /readyz, how often it probes the
    # bus, and how long a failed service or broker waits, at most, before its next start.
    metrics_host: str = Field(default="127.0.0.1", description="where `up` serves /metrics")
    metrics_port: int = Field(default=9470, ge=0, le=65535, description="0: any free port")
    bus_probe_s: float = Field(default=1.0, gt=0, description="seconds between bus probes")
    restart_backoff_max_s: float = Field(default=30.0, gt=0)
    # Fencing: how often a running process re-reads its env's incarnation (a deletion is
    # also pushed at once by NOTIFY), and how long `env delete` waits for them to stop.
    fence_check_s: float = Field(default=5.0, gt=0)
    env_delete_timeout_s: float = Field(default=30.0, ge=0)

    # Admin API token for services started by `up` (generated when unset).
    admin_token: SecretStr | None = None

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


def load_settings(**overrides: Any) -> Settings:
    return Settings(**{k: v for k, v in overrides.items() if v is not None})
