"""Connections bound to one schema.

A pool's connections carry ``search_path = <schema>``, so the SQL of an env never names
its schema and cannot touch another env's tables by accident.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson

from dlrover_events.bus.topics import check_env_name
from dlrover_events.errors import StoreUnavailable

REGISTRY_SCHEMA = "dlrover"


def env_schema(env: str) -> str:
    """``prod`` -> ``env_prod``; '-' is not valid unquoted, so it becomes '_'."""
    return "env_" + check_env_name(env).replace("-", "_")


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _init_connection(conn: asyncpg.Connection) -> None:
    for typ in ("jsonb", "json"):
        await conn.set_type_codec(
            typ,
            encoder=lambda v: orjson.dumps(v).decode(),
            decoder=orjson.loads,
            schema="pg_catalog",
        )


def _server_settings(schema: str | None) -> dict[str, str]:
    settings = {"application_name": "dlrover-events"}
    if schema is not None:
        settings["search_path"] = quote_ident(schema)
    return settings


def _unavailable(dsn: str, err: Exception) -> StoreUnavailable:
    return StoreUnavailable(
        f"cannot reach Postgres at {_redact(dsn)} ({type(err).__name__}: {err}); "
        "set DLROVER_EVENTS_PG_DSN or start the embedded stack with `dlrover-events up`"
    )


def _redact(dsn: str) -> str:
    if "@" in dsn and "://" in dsn:
        scheme, rest = dsn.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        user = creds.split(":", 1)[0]
        return f"{scheme}://{user}@{host}"
    return dsn


async def create_pool(
    dsn: str, schema: str | None = None, *, min_size: int = 1, max_size: int = 10
) -> asyncpg.Pool:
    try:
        pool = await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            init=_init_connection,
            server_settings=_server_settings(schema),
        )
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as err:
        raise _unavailable(dsn, err) from None
    assert pool is not None
    return pool


async def connect(dsn: str, schema: str | None = None, **kwargs: Any) -> asyncpg.Connection:
    try:
        conn = await asyncpg.connect(dsn, server_settings=_server_settings(schema), **kwargs)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as err:
        raise _unavailable(dsn, err) from None
    await _init_connection(conn)
    return conn
