"""One scheduler per env: the brain instance that holds the env's leader lock decides.

A cluster scheduler (`Policy.scheduler`) decides over every arrived job of the env at
once, so it is right only in a brain that holds every input partition of the env. Spread
over several instances by the consumer group, each would schedule its share of the jobs
onto the whole cluster. So, for an env with a scheduler, a brain instance first takes the
env's leader lock, and only then joins the consumer group: the group then has one member,
which is assigned every partition. The other instances stand by, polling the lock; when
the leader dies its lock goes with its Postgres session, and a standby takes over within
a poll, resuming every partition from the checkpoint as any partition load does.

The lock is a Postgres session advisory lock (as `dlrover_events.runtime.fence` fences an env),
in the two-key space (`LOCK_CLASS`, hashtext(env)), apart from the fence's one-key locks.
Postgres releases it when the session ends, so a SIGKILLed leader frees it as soon as its
connection closes. A leader that loses its lock's connection (Postgres restarted, the
session terminated, the network gone) can no longer know that it alone decides: `lost`
is set at once and the brain stops consuming (fail-stop, no last checkpoint), then
stands by again like any other instance.

Envs without a scheduler take no lock: their partitions spread over the instances.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from enum import StrEnum

import asyncpg

from dlrover_events.backoff import Backoff
from dlrover_events.errors import UserError
from dlrover_events.lifecycle import cancel_and_wait, wait_or_stop
from dlrover_events.store.database import connect

log = logging.getLogger(__name__)

#: First key of the leader lock (int4, "DLEB"); the second is hashtext(env).
LOCK_CLASS = 0x444C4542
#: application_name of a leader lock's connection: a standby names the leader by it.
APP_PREFIX = "dle-leader"

#: What may fail while talking to Postgres about the lock (then: retry, or lose it).
PG_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, UserError, TimeoutError)


class Role(StrEnum):
    STANDBY = "standby"
    LEADER = "leader"


def leader_app_name(env: str) -> str:
    """Who holds the lock, as a standby reads it in pg_stat_activity (at most 63 bytes,
    Postgres' limit)."""
    host = socket.gethostname()[:20]
    return f"{APP_PREFIX} {env} {host} pid {os.getpid()}"[:63]


def holder_of(app_name: str | None, env: str) -> str:
    """The leader as a standby names it: host and pid, or "another brain" (pure)."""
    prefix = f"{APP_PREFIX} {env} "
    if app_name and app_name.startswith(prefix):
        return app_name.removeprefix(prefix)
    return "another brain"


class Leadership:
    """The env's scheduler leader lock, taken by `acquire` and given back by `release`.

    `poll_s`: how often a standby tries the lock, and how often a leader checks that its
    lock's connection still answers (within `poll_s` too). `lost` is set when it does not.
    """

    def __init__(self, dsn: str, env: str, *, poll_s: float) -> None:
        self.dsn = dsn
        self.env = env
        self.poll_s = poll_s
        #: Postgres away: the lock is tried again after this
        self._retry = Backoff(initial_s=poll_s, max_s=max(poll_s, 30.0))
        self.role = Role.STANDBY
        #: set once this instance found another leading (it stands by: its job then)
        self.standing_by = asyncio.Event()
        #: set while leading once the lock's connection fails: stop deciding at once
        self.lost = asyncio.Event()
        #: why the lock was lost (None while it holds)
        self.reason: str | None = None
        self._conn: asyncpg.Connection | None = None
        self._watch: asyncio.Task[None] | None = None

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Stand by until the lock is ours (True) or `stop` is set (False). Says once
        that this instance stands by, and who leads; Postgres away is retried, saying so."""
        said_standby = False
        failures = 0
        while not stop.is_set():
            try:
                holder = await self._try()
                failures = 0
            except PG_ERRORS as err:
                failures += 1
                delay = self._retry.delay(failures)
                log.warning(
                    "brain of %s: cannot take the scheduler leader lock (%s: %s); "
                    "retrying in %.1f s",
                    self.env,
                    type(err).__name__,
                    err,
                    delay,
                )
                await self._close()
                await wait_or_stop(stop, delay)
                continue
            if holder is None:
                self._lead()
                return True
            if not said_standby:
                said_standby = True
                self.standing_by.set()
                log.warning(
                    "brain of %s: standby; %s is the env's scheduler leader (one brain "
                    "instance decides an env with a cluster scheduler); taking over when "
                    "it stops",
                    self.env,
                    holder,
                )
            await wait_or_stop(stop, self.poll_s)
        await self._close()
        return False

    async def release(self) -> None:
        """Give the lock back (closing its session), as a stopping leader does."""
        await cancel_and_wait(self._watch)
        self._watch = None
        await self._close()
        self.role = Role.STANDBY

    async def _try(self) -> str | None:
        """Try the lock once: None if it is ours now, else who holds it."""
        async with asyncio.timeout(self.poll_s + 5):
            if self._conn is None or self._conn.is_closed():
                self._conn = await connect(self.dsn)
                await self._conn.execute(
                    "SELECT set_config('application_name', $1, false)", leader_app_name(self.env)
                )
            conn = self._conn
            if await conn.fetchval(
                "SELECT pg_try_advisory_lock($1, hashtext($2))", LOCK_CLASS, self.env
            ):
                return None
            app_name = await conn.fetchval(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a"
                " ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted"
                " AND l.classid = $1::int::oid AND l.objid = hashtext($2)::oid"
                " AND l.objsubid = 2 LIMIT 1",
                LOCK_CLASS,
                self.env,
            )
            return holder_of(app_name, self.env)

    def _lead(self) -> None:
        assert self._conn is not None
        self.role = Role.LEADER
        self.lost.clear()
        self.reason = None
        self._conn.add_termination_listener(self._terminated)
        self._watch = asyncio.create_task(self._watch_lock(), name=f"leader {self.env}")
        log.warning("brain of %s: the env's scheduler leader; joining its consumer group", self.env)

    def _terminated(self, conn: object) -> None:
        self._lose("its Postgres session ended")

    def _lose(self, reason: str) -> None:
        if self.role is Role.LEADER and not self.lost.is_set():
            self.reason = reason
            log.error(
                "brain of %s: lost the scheduler leader lock (%s): stopping at once, then "
                "standing by",
                self.env,
                reason,
            )
            self.lost.set()

    async def _watch_lock(self) -> None:
        """Ask the lock's session every poll: a connection that no longer answers (the
        network gone) may have lost the lock without closing here."""
        conn = self._conn
        assert conn is not None
        while not self.lost.is_set():
            await asyncio.sleep(self.poll_s)
            try:
                async with asyncio.timeout(self.poll_s):
                    await conn.fetchval("SELECT 1")
            except PG_ERRORS as err:
                self._lose(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.remove_termination_listener(self._terminated)
            with contextlib.suppress(Exception):
                await conn.close(timeout=5)


__all__ = ["APP_PREFIX", "LOCK_CLASS", "Leadership", "Role", "holder_of", "leader_app_name"]
