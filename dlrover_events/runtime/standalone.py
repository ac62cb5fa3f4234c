"""A service run as its own command (`brain`, `operator`, `gateway`, `console`, `archiver`,
`evaluator`, `watchdog`, `searcher`, `experiments-recorder`, `replay`) gets what `up` gives
the services it runs: it is fenced to its env (it stops when the env is deleted), its
metrics and probes are served, and SIGINT/SIGTERM stop it cleanly.

The probes are `up`'s (`MetricsServer` and `supervisor.readiness`, one implementation):
`/healthz` answers while the event loop does; `/readyz` answers 200 once the service said
ready (``ctx.ready``: its consumer assigned, its server listening, as the service defines
it) while the bus answers (probed as `up` probes it) and Postgres answers (the env's fence
reads the registry), else 503 with the reason. They are served on
`DLROVER_EVENTS_METRICS_HOST:DLROVER_EVENTS_METRICS_PORT` (127.0.0.1:9470: set the host to
0.0.0.0 for a cluster's probes and scrapes).

One place for it, so a new command cannot forget one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import asyncpg

from dlrover_events.lifecycle import background, close_quietly, wait_for_any
from dlrover_events.runtime import logs
from dlrover_events.runtime.broker_journal import journal_view
from dlrover_events.runtime.embedded import resolve_postgres
from dlrover_events.runtime.fence import fenced
from dlrover_events.runtime.logs import log_fields
from dlrover_events.runtime.metrics import MetricsServer
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.runtime.supervisor import BusWatch, State, readiness
from dlrover_events.settings import Settings
from dlrover_events.store.database import connect

log = logging.getLogger(__name__)


def service_state(ctx: ServiceContext) -> State:
    """A standalone service's state: it is not restarted (its process is)."""
    if ctx.stop.is_set():
        return State.STOPPED
    return State.READY if ctx.ready.is_set() else State.STARTING


@contextlib.asynccontextmanager
async def standalone(
    ctx: ServiceContext, service: str, *, signals: bool = True
) -> AsyncIterator[None]:
    """Run a command's service inside this: fenced, metrics and probes served, stopped by
    signals. ``ctx.bus`` is replaced by the bus probe's event (clear while the bus is away).

    The metrics port is `DLROVER_EVENTS_METRICS_PORT` (as for `up`); when it is taken
    (by `up`, or another command) the command says so and serves them on a free port.
    """
    logs.for_service()
    with log_fields(env=ctx.env, service=service):
        async with _standalone(ctx, service, signals=signals):
            yield


@contextlib.asynccontextmanager
async def _standalone(ctx: ServiceContext, service: str, *, signals: bool) -> AsyncIterator[None]:
    if signals:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, ctx.stop.set)
    settings = ctx.settings
    hold = JournalHold(settings.bootstrap_servers, ctx.pg_dsn)
    bus = BusWatch(
        settings.bootstrap_servers, ctx.stop, probe_s=settings.bus_probe_s, held=hold.why
    )
    ctx.bus = bus.up
    async with contextlib.aclosing(hold), fenced(ctx, (service,)) as fence:

        def ready() -> tuple[bool, dict[str, Any]]:
            return readiness(bus, {service: service_state(ctx)}, postgres=fence.holds)

        server = MetricsServer(settings.metrics_host, settings.metrics_port, readiness=ready)
        server.add(ctx.metrics)
        try:
            await server.start()
        except OSError as err:
            log.warning(
                "metrics port %s:%d is taken (%s); serving them on a free port instead",
                settings.metrics_host,
                settings.metrics_port,
                err.strerror or err,
            )
            server = MetricsServer(settings.metrics_host, 0, readiness=ready)
            server.add(ctx.metrics)
            await server.start()
        ctx.endpoints["metrics"] = server.url
        try:
            async with background(bus.run(), name=f"{service} bus probe"):
                yield
        finally:
            await server.stop()


class JournalHold:
    """Why the broker of a stack's `up` is not usable though it answers: `up` is refilling
    it from its journal (its topics are coming back). A service run alone cannot tell that
    from the broker, which answers from its restart on; the journal says it in the stack's
    database. Postgres away or no journal: nothing to say (the fence watches Postgres)."""

    def __init__(self, bootstrap_servers: str, pg_dsn: str) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._dsn = pg_dsn
        self._conn: asyncpg.Connection | None = None

    async def why(self) -> str | None:
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await connect(self._dsn)
            view = await journal_view(self._conn, self._bootstrap_servers, ())
        except Exception:
            await self.aclose()
            return None
        if view is not None and view.refilling:
            return f"the broker at {self._bootstrap_servers} is being refilled from its journal"
        return None

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await close_quietly(conn.close())


#: a service's body: runs until ``ctx.stop`` (the `run` of a `Service`, or a command's own)
ServiceRun = Callable[[ServiceContext], Coroutine[Any, None, None]]


async def serve_alone(
    settings: Settings,
    env: str,
    service: str,
    run: ServiceRun,
    *,
    on_ready: Callable[[ServiceContext], None] | None = None,
) -> None:
    """Run a service of ``env`` as this process's one service, until SIGTERM, the env's
    deletion or the service's end. Postgres is found as `up` finds it (an embedded one
    started here is stopped at the end); ``on_ready`` may say where it serves."""
    logs.for_service()
    postgres = await resolve_postgres(settings)
    try:
        ctx = ServiceContext(settings, env, postgres.dsn)
        async with standalone(ctx, service):
            running = asyncio.create_task(run(ctx), name=service)
            try:
                if await wait_for_any([ctx.ready], [running]) and on_ready is not None:
                    on_ready(ctx)
                await running
            finally:
                if not running.done():
                    ctx.stop.set()
                    await asyncio.gather(running, return_exceptions=True)
    finally:
        postgres.stop()  # only an embedded server this command started


__all__ = ["ServiceRun", "serve_alone", "service_state", "standalone"]
