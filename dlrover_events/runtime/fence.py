"""Fencing: a process that runs an env stops when that env is deleted.

Without it, a brain of a deleted env kept running and, once the env was created again,
consumed the new topics and wrote into the new schema. Each process that runs an env
holds, for as long as it runs, a shared Postgres advisory lock on the env's name, and
watches the env's registry row: the incarnation it started on must still be there and not
being deleted. `env delete` first marks the row (and NOTIFYs), then waits for the
exclusive lock, which it gets only once every such process has stopped (or died: a lock
goes with its connection). Only then are the schema and topics dropped and the name
freed, so a re-created env never meets a process of the old one.

    async with fenced(ctx):        # a standalone command, around its service
        await service.run(ctx)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Iterable, Sequence
from uuid import UUID

import asyncpg

from dlrover_events.backoff import Backoff
from dlrover_events.errors import EnvError, UserError
from dlrover_events.lifecycle import AsyncResource, cancel_and_wait
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store.database import REGISTRY_SCHEMA, connect, quote_ident

log = logging.getLogger(__name__)

#: NOTIFY channel on which `env delete` names the env it starts deleting.
FENCE_CHANNEL = "dlrover_env_fence"
#: application_name of a fence's connection: `env delete` names the holders it waits for.
APP_PREFIX = "dle-fence"


#: The two-key advisory lock space in which a fence holder also holds one shared lock per
#: service it runs (`serving`): `job submit` asks whether an operator holds the env.
#: (Apart from the fence's one-key lock and the brain leader's class.)
SERVICE_CLASS = 0x444C5356


def service_key(env: str, service: str) -> str:
    return f"{env}:{service}"


async def serving(conn: asyncpg.Connection, env: str, services: Iterable[str]) -> list[str]:
    """Which of ``services`` some process runs for ``env`` now (`up` or a command run
    alone, fenced): those whose lock a live session holds."""
    found = []
    for service in services:
        if await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = $1::int::oid AND objid = hashtext($2)::oid AND objsubid = 2)",
            SERVICE_CLASS,
            service_key(env, service),
        ):
            found.append(service)
    return found


def fence_key(env: str) -> str:
    """The advisory lock's text key (hashed by Postgres' hashtext into the lock id)."""
    return f"env-fence:{env}"


def fence_app_name(env: str) -> str:
    host = socket.gethostname()[:20]
    return f"{APP_PREFIX} {env} {host} pid {os.getpid()}"[:63]


def gone_reason(env: str, row: asyncpg.Record | None, incarnation: UUID | None) -> str | None:
    """Why a process that started on ``incarnation`` of ``env`` must stop, or None (pure)."""
    if row is None:
        return f"env {env!r} was deleted while this process ran it"
    if row["deleting_since"] is not None:
        return f"env {env!r} is being deleted (since {row['deleting_since']:%H:%M:%S})"
    if incarnation is not None and row["incarnation"] != incarnation:
        return f"env {env!r} was deleted and created again while this process ran it"
    return None


async def fence_holders(conn: asyncpg.Connection, env: str) -> list[str]:
    """The processes that hold the env's fence (their connections' application_name)."""
    rows = await conn.fetch(
        "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE $1",
        f"{APP_PREFIX} {env} %",
    )
    return sorted(r["application_name"].removeprefix(f"{APP_PREFIX} {env} ") for r in rows)


class EnvFence(AsyncResource):
    """Holds the env's fence while a process runs it; sets ``stop`` once the env is gone.

    Entering refuses (EnvError, one line) an env that does not exist or is being deleted.
    ``reason`` then says why the fence tripped; the holder should stop its work and leave
    the ``async with`` promptly: `env delete` waits for that.
    """

    def __init__(
        self,
        settings: Settings,
        dsn: str,
        env: str,
        stop: asyncio.Event,
        services: Sequence[str] = (),
    ) -> None:
        self.settings = settings
        self.dsn = dsn
        self.env = env
        #: what the holder runs for the env, each said by a lock of its own (`serving`)
        self.services = tuple(services)
        self._holder_stop = stop
        self.reason: str | None = None
        self.tripped = asyncio.Event()
        #: set while the fence's last read of the registry succeeded: Postgres answers
        #: (a standalone command's /readyz says not ready while it is clear)
        self.holds = asyncio.Event()
        self.incarnation: UUID | None = None
        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._poke = asyncio.Event()

    async def start(self) -> None:
        await self._attach()
        self._task = asyncio.create_task(self._watch(), name=f"fence {self.env}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        await self._detach()

    async def _attach(self) -> None:
        conn = await connect(self.dsn)
        try:
            await conn.execute(
                "SELECT set_config('application_name', $1, false)", fence_app_name(self.env)
            )
            await conn.execute("SELECT pg_advisory_lock_shared(hashtext($1))", fence_key(self.env))
            for service in self.services:
                await conn.execute(
                    "SELECT pg_advisory_lock_shared($1, hashtext($2))",
                    SERVICE_CLASS,
                    service_key(self.env, service),
                )
            row = await self._row(conn)
            reason = gone_reason(self.env, row, self.incarnation)
            if reason is not None:
                if self.incarnation is None:  # at start: the env is not there to run
                    raise EnvError(
                        f"{reason}; see `dlrover-events env list`"
                        if row is not None
                        else f"no env named {self.env!r} (see `dlrover-events env list`)"
                    )
                self._trip(reason)
            assert row is not None or self.reason is not None
            if row is not None and self.incarnation is None:
                self.incarnation = row["incarnation"]
            await conn.add_listener(FENCE_CHANNEL, self._notified)
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        self.holds.set()

    async def _detach(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close(timeout=5)

    async def _row(self, conn: asyncpg.Connection) -> asyncpg.Record | None:
        try:
            return await conn.fetchrow(
                f"SELECT incarnation, deleting_since FROM {quote_ident(REGISTRY_SCHEMA)}.envs"
                " WHERE name = $1",
                self.env,
            )
        except asyncpg.UndefinedTableError:
            return None

    def _notified(self, conn: object, pid: int, channel: str, payload: object) -> None:
        if payload == self.env:
            self._poke.set()

    def _trip(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            log.error("%s: stopping", reason)
        self.tripped.set()
        self._holder_stop.set()

    async def _watch(self) -> None:
        """Re-read the row on every NOTIFY and every fence_check_s; reconnect (with
        backoff) when Postgres goes away, since the lock went with the connection."""
        backoff = Backoff(max_s=self.settings.restart_backoff_max_s)
        failures = 0
        while not self.tripped.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), self.settings.fence_check_s)
            self._poke.clear()
            try:
                if self._conn is None or self._conn.is_closed():
                    await self._detach()
                    await self._attach()
                    log.warning("fence of env %s holds again", self.env)
                reason = gone_reason(self.env, await self._row(self._conn), self.incarnation)  # type: ignore[arg-type]
                failures = 0
                self.holds.set()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, UserError) as err:
                self.holds.clear()
                failures += 1
                delay = backoff.delay(failures)
                log.warning(
                    "fence of env %s cannot read the registry (%s); retrying in %.1fs",
                    self.env,
                    err,
                    delay,
                )
                await self._detach()
                await asyncio.sleep(delay)
                continue
            if reason is not None:
                self._trip(reason)


@contextlib.asynccontextmanager
async def fenced(ctx: ServiceContext, services: Sequence[str] = ()) -> AsyncIterator[EnvFence]:
    """Run ``services`` of ``ctx.env`` fenced: ``ctx.stop`` is set once the env is deleted."""
    async with EnvFence(ctx.settings, ctx.pg_dsn, ctx.env, ctx.stop, services) as fence:
        yield fence
