"""Postgres: the env registry (schema ``dlrover``) and one schema per env (``env_<name>``)."""

from dlrover_events.store.database import (
    REGISTRY_SCHEMA,
    connect,
    create_pool,
    env_schema,
)
from dlrover_events.store.env_store import EnvStore
from dlrover_events.store.migrations import apply_migrations, prepare_env

__all__ = [
    "REGISTRY_SCHEMA",
    "EnvStore",
    "apply_migrations",
    "connect",
    "create_pool",
    "env_schema",
    "prepare_env",
]
