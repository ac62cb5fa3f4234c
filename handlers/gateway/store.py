"""Config documents in the env's Postgres (the system of record) and their change feed.

Each write holds the document's row lock while its ConfigChange is published and acked,
and commits only after: a change the bus refused is rolled back, so Postgres never holds a
version the gateways will not hear of. The other window (published, then the commit fails)
leaves the topic ahead of Postgres; ``reconcile`` republishes Postgres' state over it at
service start, and any later change of that name supersedes it on the compacted topic.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import asyncpg
from aiokafka.errors import KafkaError

from dlrover_events.bus.producer import Producer
from dlrover_events.errors import BusUnavailable
from schemas.config import ConfigChange, ConfigDocument
from schemas.envelope import utcnow

log = logging.getLogger(__name__)

SOURCE = "gateway"


class StoreError(Exception):
    """A refused write, with the HTTP status that says why."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class NotFound(StoreError):
    status = 404
    code = "not_found"


class AlreadyExists(StoreError):
    status = 409
    code = "already_exists"


class VersionConflict(StoreError):
    status = 409
    code = "version_conflict"


class FeedUnavailable(StoreError):
    status = 503
    code = "bus_unavailable"


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    name: str
    version: int
    op: Literal["upsert", "delete"]
    document: ConfigDocument | None
    changed_at: datetime


def _to_row(doc: ConfigDocument) -> dict[str, Any]:
    return doc.model_dump(mode="json", by_alias=True)


if TYPE_CHECKING:
    Conn = asyncpg.pool.PoolConnectionProxy[asyncpg.Record]


def _doc(row: asyncpg.Record) -> ConfigDocument:
    return ConfigDocument.model_validate(row["document"])


class ConfigStore:
    def __init__(self, pool: asyncpg.Pool, env: str, producer: Producer) -> None:
        self.pool = pool
        self.env = env
        self.producer = producer

    async def get(self, name: str) -> ConfigDocument | None:
        row = await self.pool.fetchrow(
            "SELECT document FROM configs WHERE name = $1 AND NOT deleted", name
        )
        return _doc(row) if row is not None else None

    async def documents(self, prefix: str = "") -> list[ConfigDocument]:
        """Live documents; ``prefix`` narrows them to one source's names (ConfigMaps)."""
        rows = await self.pool.fetch(
            "SELECT document FROM configs WHERE NOT deleted"
            " AND left(name, length($1)) = $1 ORDER BY name",
            prefix,
        )
        return [_doc(r) for r in rows]

    async def history(self, name: str) -> list[HistoryEntry]:
        rows = await self.pool.fetch(
            "SELECT name, version, op, document, changed_at FROM config_history"
            " WHERE name = $1 ORDER BY version",
            name,
        )
        return [
            HistoryEntry(
                r["name"],
                r["version"],
                r["op"],
                _doc(r) if r["document"] is not None else None,
                r["changed_at"],
            )
            for r in rows
        ]

    async def create(self, doc: ConfigDocument) -> ConfigDocument:
        """A new name; a deleted name may be reused and continues its version count."""
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT version, deleted FROM configs WHERE name = $1 FOR UPDATE", doc.name
            )
            if row is not None and not row["deleted"]:
                raise AlreadyExists(
                    f"document {doc.name!r} already exists (version {row['version']}); "
                    "update it with PUT and its version",
                    current_version=row["version"],
                )
            version = 1 if row is None else row["version"] + 1
            stored = doc.model_copy(update={"version": version, "updated_at": utcnow()})
            try:
                await self._write(conn, stored, insert=row is None)
            except asyncpg.UniqueViolationError:  # lost a race with another create
                raise AlreadyExists(f"document {doc.name!r} already exists") from None
            await self._publish_upsert(stored)
        return stored

    async def update(self, doc: ConfigDocument, expected_version: int) -> ConfigDocument:
        async with self.pool.acquire() as conn, conn.transaction():
            current = await self._current(conn, doc.name)
            if current != expected_version:
                raise VersionConflict(
                    f"document {doc.name!r} is at version {current}, not {expected_version}; "
                    "read it again and re-apply your change",
                    current_version=current,
                )
            stored = doc.model_copy(update={"version": current + 1, "updated_at": utcnow()})
            await self._write(conn, stored, insert=False)
            await self._publish_upsert(stored)
        return stored

    async def delete(self, name: str, expected_version: int) -> int:
        """Marks the document deleted; returns the version of the deletion."""
        async with self.pool.acquire() as conn, conn.transaction():
            current = await self._current(conn, name)
            if current != expected_version:
                raise VersionConflict(
                    f"document {name!r} is at version {current}, not {expected_version}",
                    current_version=current,
                )
            version = current + 1
            await conn.execute(
                "UPDATE configs SET version = $2, deleted = true, updated_at = now()"
                " WHERE name = $1",
                name,
                version,
            )
            await conn.execute(
                "INSERT INTO config_history (name, version, op, document)"
                " VALUES ($1, $2, 'delete', NULL)",
                name,
                version,
            )
            await self._send(
                ConfigChange(env=self.env, source=SOURCE, op="delete", name=name, version=version)
            )
        return version

    async def bulk_upsert(self, docs: Iterable[ConfigDocument]) -> int:
        """Load many documents at once (imports, the benchmark), each one version on.

        One transaction and one pipelined publish; the same all-or-nothing rule as a
        single write.
        """
        batch = list(docs)
        if not batch:
            return 0
        now = utcnow()
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "SELECT name, version FROM configs WHERE name = ANY($1::text[]) FOR UPDATE",
                [d.name for d in batch],
            )
            versions = {r["name"]: r["version"] for r in rows}
            stored = [
                d.model_copy(update={"version": versions.get(d.name, 0) + 1, "updated_at": now})
                for d in batch
            ]
            cols = [(d.name, d.version, _to_row(d)) for d in stored]
            names, vers, bodies = (list(c) for c in zip(*cols, strict=True))
            await conn.execute(
                "INSERT INTO configs (name, version, document, deleted)"
                " SELECT n, v, d, false"
                " FROM unnest($1::text[], $2::int[], $3::jsonb[]) AS t(n, v, d)"
                " ON CONFLICT (name) DO UPDATE SET version = EXCLUDED.version,"
                " document = EXCLUDED.document, deleted = false, updated_at = now()",
                names,
                vers,
                bodies,
            )
            await conn.execute(
                "INSERT INTO config_history (name, version, op, document)"
                " SELECT n, v, 'upsert', d"
                " FROM unnest($1::text[], $2::int[], $3::jsonb[]) AS t(n, v, d)",
                names,
                vers,
                bodies,
            )
            changes = [
                ConfigChange(
                    env=self.env,
                    source=SOURCE,
                    op="upsert",
                    name=d.name,
                    version=d.version,
                    document=d,
                )
                for d in stored
            ]
            try:
                await self.producer.publish_many(changes)
            except (KafkaError, BusUnavailable) as err:
                raise FeedUnavailable(
                    f"cannot publish the changes ({err}); nothing was written"
                ) from None
        return len(stored)

    async def reconcile(self, seen: Mapping[str, int]) -> int:
        """Republish every document whose state on the topic (``seen``: name -> version,
        as the caught-up follower knows it) differs from Postgres; returns how many.

        Each is re-read under its row lock, so a write running at the same time cannot be
        overtaken on the topic by this older state.
        """
        rows = await self.pool.fetch("SELECT name, version FROM configs")
        stale = [r["name"] for r in rows if seen.get(r["name"]) != r["version"]]
        for name in stale:
            async with self.pool.acquire() as conn, conn.transaction():
                r = await conn.fetchrow(
                    "SELECT version, deleted, document FROM configs WHERE name = $1 FOR UPDATE",
                    name,
                )
                if r is None:
                    continue
                if r["deleted"]:
                    change = ConfigChange(
                        env=self.env, source=SOURCE, op="delete", name=name, version=r["version"]
                    )
                else:
                    doc = _doc(r)
                    change = ConfigChange(
                        env=self.env,
                        source=SOURCE,
                        op="upsert",
                        name=name,
                        version=doc.version,
                        document=doc,
                    )
                await self._send(change)
        if stale:
            log.warning("republished %d config change(s) the topic had missed", len(stale))
        return len(stale)

    async def _current(self, conn: Conn, name: str) -> int:
        row = await conn.fetchrow(
            "SELECT version, deleted FROM configs WHERE name = $1 FOR UPDATE", name
        )
        if row is None or row["deleted"]:
            raise NotFound(f"no document named {name!r}")
        return int(row["version"])

    async def _write(self, conn: Conn, doc: ConfigDocument, *, insert: bool) -> None:
        body = _to_row(doc)
        if insert:
            await conn.execute(
                "INSERT INTO configs (name, version, document) VALUES ($1, $2, $3)",
                doc.name,
                doc.version,
                body,
            )
        else:
            await conn.execute(
                "UPDATE configs SET version = $2, document = $3, deleted = false,"
                " updated_at = now() WHERE name = $1",
                doc.name,
                doc.version,
                body,
            )
        await conn.execute(
            "INSERT INTO config_history (name, version, op, document)"
            " VALUES ($1, $2, 'upsert', $3)",
            doc.name,
            doc.version,
            body,
        )

    async def _publish_upsert(self, doc: ConfigDocument) -> None:
        await self._send(
            ConfigChange(
                env=self.env,
                source=SOURCE,
                op="upsert",
                name=doc.name,
                version=doc.version,
                document=doc,
            )
        )

    async def _send(self, change: ConfigChange) -> None:
        try:
            await self.producer.publish(change)
        except (KafkaError, BusUnavailable) as err:
            raise FeedUnavailable(
                f"cannot publish the change of {change.name!r} ({err}); nothing was written"
            ) from None
