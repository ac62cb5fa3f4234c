"""Versioned plain-SQL migrations, applied once per schema and recorded there.

Files are ``sql/registry/NNNN_name.sql`` (schema ``dlrover``) or ``sql/env/NNNN_name.sql``
(each ``env_<name>`` schema). An advisory lock per schema lets several processes start at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Literal

import asyncpg

from dlrover_events.errors import UserError
from dlrover_events.store.database import connect, env_schema, quote_ident

Kind = Literal["registry", "env"]
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations(kind: Kind) -> list[Migration]:
    folder = resources.files("dlrover_events.store").joinpath("sql", kind)
    found = []
    for entry in folder.iterdir():
        m = _FILE.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda mig: mig.version)
    versions = [mig.version for mig in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration versions in {kind}: {versions}")
    return found


async def apply_migrations(conn: asyncpg.Connection, schema: str, kind: Kind) -> list[int]:
    """Create ``schema`` if needed and apply its pending migrations; returns those applied."""
    q = quote_ident(schema)
    applied_now: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"migrate:{schema}")
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q}")
        await conn.execute(f"SET LOCAL search_path TO {q}")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for mig in load_migrations(kind):
            if mig.version in done:
                continue
            await conn.execute(mig.sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                mig.version,
                mig.name,
            )
            applied_now.append(mig.version)
    return applied_now


async def prepare_env(dsn: str, env: str) -> None:
    """The env must exist (`env create` made its schema); a schema made by an older
    version gets the migrations since, so a service reading it finds its tables."""
    schema = env_schema(env)
    conn = await connect(dsn)
    try:
        exists = await conn.fetchval(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = $1", schema
        )
        if not exists:
            raise UserError(
                f"env {env!r} does not exist; create it with `dlrover-events env create`"
            )
        await apply_migrations(conn, schema, "env")
    finally:
        await conn.close()
