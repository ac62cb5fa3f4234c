"""The env registry: create, list and delete envs, each a topic prefix plus a schema.

Postgres (schema ``dlrover``) is the system of record; every change is announced on the
compacted ``dlrover.control`` topic so running processes learn it without a restart.
Exactly one env is real; a unique index makes a second one impossible, even in a race.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg
from aiokafka.admin import AIOKafkaAdminClient
from pydantic import BaseModel

from dlrover_events.bus.admin import TopicAdmin
from dlrover_events.bus.kafka_client import kafka_connection, start_kafka_client
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import CONTROL_TOPIC, check_env_name, env_topics
from dlrover_events.envs.env_settings import validate_settings
from dlrover_events.errors import EnvError
from dlrover_events.runtime.fence import FENCE_CHANNEL, fence_holders, fence_key
from dlrover_events.settings import Settings
from dlrover_events.store.database import (
    REGISTRY_SCHEMA,
    connect,
    env_schema,
    quote_ident,
)
from dlrover_events.store.migrations import apply_migrations
from schemas.control import EnvAnnouncement, EnvMode
from schemas.env_settings import EnvSettings

log = logging.getLogger(__name__)

#: Rows of the registry's history (a module-level alias: EnvRegistry has a `list` method).
EnvChanges = list[dict[str, Any]]


class EnvRecord(BaseModel):
    name: str
    mode: EnvMode
    partitions: int
    #: what was set (sparse: `schemas.env_settings.EnvSettings.stored`)
    settings: dict[str, Any]
    #: counts the settings' changes (announced: a follower takes only newer ones)
    settings_version: int = 1
    created_at: datetime
    updated_at: datetime
    #: new each time the name is created: a process fenced on one knows the next is not it
    incarnation: UUID
    #: set while `env delete` waits for the env's processes to stop
    deleting_since: datetime | None = None


EnvRecords = list[EnvRecord]


def _second_real(real: str, name: str) -> str:
    return (
        f"env {real!r} is already the real env and only one env is real; create {name!r} "
        "as virtual (--mode virtual)"
    )


def _being_deleted(name: str) -> str:
    return (
        f"env {name!r} is being deleted and some of its processes still run; stop them, "
        f"then run `dlrover-events env delete {name}` again"
    )


def _record(row: asyncpg.Record) -> EnvRecord:
    return EnvRecord(**dict(row))


class EnvRegistry:
    """Uses one connection for the registry; topic admin and producer for announcements."""

    def __init__(self, settings: Settings, dsn: str) -> None:
        self._settings = settings
        self._dsn = dsn

    async def _conn(self) -> asyncpg.Connection:
        conn = await connect(self._dsn)
        await apply_migrations(conn, REGISTRY_SCHEMA, "registry")
        await conn.execute(f"SET search_path TO {quote_ident(REGISTRY_SCHEMA)}")
        return conn

    async def list(self) -> list[EnvRecord]:
        conn = await self._conn()
        try:
            rows = await conn.fetch("SELECT * FROM envs WHERE deleting_since IS NULL ORDER BY name")
        finally:
            await conn.close()
        return [_record(r) for r in rows]

    async def get(self, name: str) -> EnvRecord | None:
        conn = await self._conn()
        try:
            row = await conn.fetchrow(
                "SELECT * FROM envs WHERE name = $1 AND deleting_since IS NULL", name
            )
        finally:
            await conn.close()
        return _record(row) if row else None

    async def migrate(self, name: str) -> EnvRecord | None:
        """The env's record, its schema given the tables added since the version that made
        it (a service of the env calls this as it starts); None if there is no such env."""
        conn = await self._conn()
        try:
            async with conn.transaction():
                # held until migrated: a delete of the env waits, and is not undone here
                row = await conn.fetchrow(
                    "SELECT * FROM envs WHERE name = $1 AND deleting_since IS NULL FOR SHARE",
                    name,
                )
                if row is not None:
                    await apply_migrations(conn, env_schema(name), "env")
        finally:
            await conn.close()
        return _record(row) if row else None

    async def real(self) -> EnvRecord | None:
        return next((e for e in await self.list() if e.mode == EnvMode.REAL), None)

    async def create(
        self,
        name: str,
        mode: EnvMode = EnvMode.VIRTUAL,
        *,
        partitions: int | None = None,
        settings: Mapping[str, Any] | EnvSettings | None = None,
        exist_ok: bool = False,
    ) -> EnvRecord:
        """Register the env, migrate its schema, create its topics, announce it.

        ``settings`` are validated first (`dlrover_events.envs.env_settings`: an EnvSettingsError
        names what is wrong); an env that exists already (``exist_ok``) keeps its own,
        which `change_settings` changes. Topics are created inside the registry
        transaction: if the broker refuses, the env is not registered and nothing
        half-made is left in Postgres.
        """
        check_env_name(name)
        stored = validate_settings(settings or {}).stored()
        parts = partitions or self._settings.partitions
        if parts < 1:
            raise EnvError("partitions must be at least 1")
        conn = await self._conn()
        try:
            existing = await conn.fetchrow("SELECT * FROM envs WHERE name = $1", name)
            if existing is not None:
                record = _record(existing)
                if record.deleting_since is not None:
                    raise EnvError(_being_deleted(name))
                if not exist_ok:
                    raise EnvError(f"env {name!r} already exists ({record.mode.value})")
                if record.mode != mode:
                    raise EnvError(f"env {name!r} exists as {record.mode.value}, not {mode.value}")
                await apply_migrations(conn, env_schema(name), "env")
                async with TopicAdmin(self._settings) as admin:
                    await admin.ensure_control_topic()
                    await admin.ensure_env_topics(name, record.partitions)
                return record
            if mode == EnvMode.REAL:
                real = await conn.fetchval("SELECT name FROM envs WHERE mode = 'real'")
                if real is not None:
                    raise EnvError(_second_real(real, name))
            async with conn.transaction():
                try:
                    row = await conn.fetchrow(
                        "INSERT INTO envs (name, mode, partitions, settings)"
                        " VALUES ($1, $2, $3, $4) RETURNING *",
                        name,
                        mode.value,
                        parts,
                        stored,
                    )
                except asyncpg.UniqueViolationError as err:
                    if err.constraint_name == "envs_one_real":  # lost a race to another
                        raise EnvError(_second_real("another", name)) from None
                    raise EnvError(f"env {name!r} already exists") from None
                await conn.execute(
                    "INSERT INTO env_changes (name, change, mode, settings)"
                    " VALUES ($1, 'create', $2, $3)",
                    name,
                    mode.value,
                    stored,
                )
                await apply_migrations(conn, env_schema(name), "env")
                async with TopicAdmin(self._settings) as admin:
                    await admin.ensure_control_topic()
                    await admin.ensure_env_topics(name, parts)
            assert row is not None  # INSERT ... RETURNING always returns the row
            record = _record(row)
        finally:
            await conn.close()
        await self._announce(record)
        return record

    async def delete(self, name: str, *, force: bool = False) -> None:
        """Fence the env's processes, then drop its schema and topics. The real env needs
        ``force``.

        First the row is marked as being deleted (NOTIFY tells every fenced process at
        once), then this waits, up to ``env_delete_timeout_s``, until no process holds
        the env's fence; only then are schema, topics and name dropped, so a process of
        the old env never meets the env created again under its name. If some process
        does not stop in time the env stays marked and this says which; run it again.
        """
        check_env_name(name)
        conn = await self._conn()
        try:
            async with conn.transaction():
                row = await conn.fetchrow("SELECT * FROM envs WHERE name = $1 FOR UPDATE", name)
                if row is None:
                    raise EnvError(f"no env named {name!r} (see `dlrover-events env list`)")
                if row["mode"] == EnvMode.REAL.value and not force:
                    raise EnvError(
                        f"env {name!r} is the real env; pass --force to delete it anyway"
                    )
                if row["deleting_since"] is None:
                    await conn.execute(
                        "UPDATE envs SET deleting_since = now() WHERE name = $1", name
                    )
                    await conn.execute(
                        "INSERT INTO env_changes (name, change) VALUES ($1, 'delete')", name
                    )
                await conn.execute("SELECT pg_notify($1, $2)", FENCE_CHANNEL, name)
            await self._wait_fenced(conn, name)
            async with conn.transaction():
                await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(env_schema(name))} CASCADE")
                async with TopicAdmin(self._settings) as admin:
                    await admin.delete_env_topics(name)
                await conn.execute("DELETE FROM envs WHERE name = $1", name)
        finally:
            await conn.close()  # and with it the exclusive fence
        async with Producer(self._settings) as producer:
            # A tombstone: compaction then forgets the env entirely.
            await producer.send_raw(CONTROL_TOPIC, None, name.encode())

    async def _wait_fenced(self, conn: asyncpg.Connection, name: str) -> None:
        """Take the env's fence exclusively: every process that runs the env has left."""
        timeout = self._settings.env_delete_timeout_s
        deadline = time.monotonic() + timeout
        said = False
        while not await conn.fetchval("SELECT pg_try_advisory_lock(hashtext($1))", fence_key(name)):
            holders = await fence_holders(conn, name)
            if time.monotonic() >= deadline:
                who = ", ".join(holders) or "unknown processes"
                raise EnvError(
                    f"env {name!r} is marked deleted but {len(holders) or 'some'} process(es)"
                    f" did not stop within {timeout:.0f}s ({who}); stop them, then run"
                    f" `dlrover-events env delete {name}` again"
                )
            if not said and holders:
                log.warning("env %s: waiting for %s to stop", name, ", ".join(holders))
                said = True
            await asyncio.sleep(0.1)

    async def resync(self, *, repair: bool = False) -> EnvRecords:
        """Make the bus agree with the registry: every env's topics (real and virtual, with
        their partition counts) and its announcement on dlrover.control.

        `up` calls this on a broker it (re)started: the embedded broker keeps topics in
        memory, and a topic a client's metadata request re-creates first gets the broker's
        default count, which moves a job to another partition. With ``repair`` (only for a
        broker that just started empty) such a topic is deleted and made again; otherwise
        a wrong count is only logged, since deleting a topic loses its records.
        """
        envs = await self.list()
        for attempt in range(3):
            async with TopicAdmin(self._settings) as admin:
                await admin.ensure_control_topic()
                for env in envs:
                    await admin.ensure_env_topics(env.name, env.partitions)
            wrong = await self._wrong_partitions(envs)
            if not wrong:
                break
            what = ", ".join(f"{t} ({n}, not {want})" for t, (n, want) in sorted(wrong.items()))
            if not repair or attempt == 2:
                log.error("topics with another partition count than their env's: %s", what)
                break
            log.warning("re-making topics a client created first: %s", what)
            await self._delete_topics(list(wrong))
        for env in envs:
            await self._announce(env)
        return envs

    async def _wrong_partitions(self, envs: EnvRecords) -> dict[str, tuple[int, int]]:
        want = {t: e.partitions for e in envs for t in env_topics(e.name)}
        client = AIOKafkaAdminClient(
            **kafka_connection(self._settings),
            client_id=f"{self._settings.client_id}-admin",
            request_timeout_ms=self._settings.request_timeout_ms,
        )
        await start_kafka_client(client, self._settings)
        try:
            found = await client.describe_topics(list(want)) if want else []
        finally:
            await client.close()
        return {
            m["topic"]: (len(m["partitions"]), want[m["topic"]])
            for m in found
            if m["topic"] in want and m["partitions"] and len(m["partitions"]) != want[m["topic"]]
        }

    async def _delete_topics(self, names: Sequence[str]) -> None:
        client = AIOKafkaAdminClient(
            **kafka_connection(self._settings),
            client_id=f"{self._settings.client_id}-admin",
            request_timeout_ms=self._settings.request_timeout_ms,
        )
        await start_kafka_client(client, self._settings)
        try:
            await client.delete_topics(names)
        finally:
            await client.close()

    async def promote(self, name: str, *, reason: str = "") -> tuple[EnvRecord, EnvRecord | None]:
        """Make ``name`` the real env and the old real env virtual, in one transaction.

        Returns (new real, old real). The old env is announced virtual before the new one
        is announced real, so a process following dlrover.control never sees two real
        envs; at worst, for a moment, none.
        """
        check_env_name(name)
        conn = await self._conn()
        try:
            async with conn.transaction():
                rows = await conn.fetch(
                    "SELECT * FROM envs WHERE name = $1 OR mode = 'real' ORDER BY name FOR UPDATE",
                    name,
                )
                target = next((r for r in rows if r["name"] == name), None)
                if target is None:
                    raise EnvError(f"no env named {name!r} (see `dlrover-events env list`)")
                if target["mode"] == EnvMode.REAL.value:
                    raise EnvError(f"env {name!r} is already the real env")
                old = next((r for r in rows if r["mode"] == EnvMode.REAL.value), None)
                why = reason or "promoted"
                if old is not None:
                    await conn.execute(
                        "UPDATE envs SET mode = 'virtual', updated_at = now() WHERE name = $1",
                        old["name"],
                    )
                    await conn.execute(
                        "INSERT INTO env_changes (name, change, mode, reason)"
                        " VALUES ($1, 'demote', 'virtual', $2)",
                        old["name"],
                        why,
                    )
                new_row = await conn.fetchrow(
                    "UPDATE envs SET mode = 'real', updated_at = now() WHERE name = $1 RETURNING *",
                    name,
                )
                await conn.execute(
                    "INSERT INTO env_changes (name, change, mode, reason)"
                    " VALUES ($1, 'promote', 'real', $2)",
                    name,
                    why,
                )
                old_row = (
                    await conn.fetchrow("SELECT * FROM envs WHERE name = $1", old["name"])
                    if old is not None
                    else None
                )
        finally:
            await conn.close()
        assert new_row is not None
        new_rec, old_rec = _record(new_row), _record(old_row) if old_row else None
        if old_rec is not None:
            await self._announce(old_rec, reason=why)
        await self._announce(new_rec, reason=why)
        return new_rec, old_rec

    async def change_settings(
        self,
        name: str,
        edit: Callable[[dict[str, Any]], Mapping[str, Any]],
        *,
        reason: str = "",
    ) -> tuple[EnvRecord, bool]:
        """Change the env's settings in place: ``edit`` gets what is stored and returns
        the new document, which is validated (an EnvSettingsError names what is wrong, and
        nothing is stored), stored with the next settings version and a history row,
        then announced on dlrover.control, where the env's running brains and operators
        take it. Returns the record and whether anything changed (an edit that changes
        nothing stores and announces nothing).

        The row is locked from read to write, so two changes at once apply one after the
        other, the second to what the first stored.
        """
        check_env_name(name)
        conn = await self._conn()
        try:
            async with conn.transaction():
                row = await conn.fetchrow(
                    "SELECT * FROM envs WHERE name = $1 AND deleting_since IS NULL FOR UPDATE",
                    name,
                )
                if row is None:
                    raise EnvError(f"no env named {name!r} (see `dlrover-events env list`)")
                before = _record(row)
                stored = validate_settings(edit(dict(before.settings))).stored()
                if stored == before.settings:
                    return before, False
                row = await conn.fetchrow(
                    "UPDATE envs SET settings = $2, settings_version = settings_version + 1,"
                    " updated_at = now() WHERE name = $1 RETURNING *",
                    name,
                    stored,
                )
                await conn.execute(
                    "INSERT INTO env_changes (name, change, mode, reason, settings)"
                    " VALUES ($1, 'settings', $2, $3, $4)",
                    name,
                    before.mode.value,
                    reason,
                    stored,
                )
        finally:
            await conn.close()
        assert row is not None
        record = _record(row)
        await self._announce(record, reason=reason)
        return record, True

    async def changes(self, name: str | None = None) -> EnvChanges:
        """The registry's history: create, delete, promote, demote, settings, with reasons
        (and the settings a create or a settings change stored)."""
        conn = await self._conn()
        try:
            rows = await conn.fetch(
                "SELECT name, change, mode, reason, settings, changed_at FROM env_changes"
                " WHERE $1::text IS NULL OR name = $1 ORDER BY id",
                name,
            )
        finally:
            await conn.close()
        return [dict(r) for r in rows]

    async def _announce(self, record: EnvRecord, reason: str = "") -> None:
        async with Producer(self._settings) as producer:
            await producer.publish(
                EnvAnnouncement(
                    env=record.name,
                    source="env-registry",
                    name=record.name,
                    mode=record.mode,
                    partitions=record.partitions,
                    settings=record.settings,
                    settings_version=record.settings_version,
                    reason=reason,
                )
            )
