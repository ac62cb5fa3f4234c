"""`dlrover-events up`: the embedded stack in one command, stopped cleanly by Ctrl-C.

It supervises what it starts (dlrover_events.runtime.supervisor): a failed service is said and
restarted with backoff, a dead broker is said and started again, the real env's fence
stops everything if the env is deleted, and the broker dies with `up` even by SIGKILL.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import time
from dataclasses import dataclass

import typer
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table

from dlrover_events.backoff import Backoff
from dlrover_events.cli.runner import run_async
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.lifecycle import background, end_within, wait_for_any, wait_or_stop
from dlrover_events.runtime import logs
from dlrover_events.runtime.broker_journal import BrokerJournal
from dlrover_events.runtime.embedded import Broker, Postgres, ensure_database, resolve_postgres
from dlrover_events.runtime.fence import EnvFence
from dlrover_events.runtime.logs import log_fields
from dlrover_events.runtime.metrics import MetricsServer, ServiceMetrics
from dlrover_events.runtime.services import Service, ServiceContext, discover_services
from dlrover_events.runtime.supervisor import (
    STOP_GRACE_S,
    BusWatch,
    Supervised,
    readiness,
)
from dlrover_events.settings import Settings, load_settings
from dlrover_events.store.database import _redact
from schemas.control import EnvMode

log = logging.getLogger(__name__)

#: how long `up` waits for every service to say ready before it gives up
READY_TIMEOUT_S = 60.0


@dataclass
class Stack:
    settings: Settings
    broker: Broker | None = None
    postgres: Postgres | None = None
    #: the embedded broker's records in Postgres (broker_storage=postgres)
    journal: BrokerJournal | None = None

    async def start_broker(self) -> None:
        """Start the embedded broker and, with a journal, refill it with its history."""
        assert self.broker is not None
        await self.broker.start_async()  # from this (the main) thread: see Broker
        if self.journal is not None:
            refill = await self.journal.refill()
            log.warning(
                "broker refilled from its journal: %d topics, %d records, %d groups' commits"
                " in %.1fs",
                refill.topics,
                refill.records,
                refill.groups,
                refill.seconds,
            )

    async def close(self) -> None:
        if self.journal is not None:
            if self.broker is not None and self.broker.exit_code() is None:
                await self.journal.drain()  # every record in, before the broker stops
            await self.journal.close()
        if self.postgres is not None:
            self.postgres.stop()
        if self.broker is not None:
            self.broker.stop()


def up(
    only: list[str] = typer.Option(None, "--service", "-s", help="run only these services"),
) -> None:
    """Start the broker (tansu), Postgres, the real env and its services on 127.0.0.1.

    An external Kafka or Postgres is just settings: with DLROVER_EVENTS_BOOTSTRAP_SERVERS
    set no broker is started; with DLROVER_EVENTS_PG_DSN set no Postgres is started.
    A failed service is restarted with backoff; the broker dies with `up`; /metrics,
    /healthz and /readyz on DLROVER_EVENTS_METRICS_PORT (127.0.0.1:9470).
    """
    logs.for_service()
    run_async(_up(load_settings(), only or []))


async def _up(settings: Settings, only: list[str]) -> None:
    services = discover_services()
    unknown = sorted(set(only) - set(services))
    if unknown:
        raise UserError(f"unknown service(s) {', '.join(unknown)}; known: {', '.join(services)}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stack = Stack(settings)
    try:
        stack.postgres = await resolve_postgres(settings)
        dsn = stack.postgres.dsn
        if "bootstrap_servers" not in settings.model_fields_set:
            stack.broker = Broker(settings.host, settings.broker_port, settings.data_dir / "logs")
            settings = settings.with_overrides(bootstrap_servers=stack.broker.bootstrap_servers)
            if settings.broker_storage == "postgres":
                journal_dsn = await ensure_database(dsn, settings.broker_database)
                stack.journal = await BrokerJournal.open(settings, journal_dsn)
        registry = EnvRegistry(settings, dsn)
        while not stop.is_set():
            if stack.broker is not None:
                await stack.start_broker()
            real = await registry.real()
            env = real.name if real else settings.default_env
            await registry.create(env, EnvMode.REAL, exist_ok=True)
            envs = await registry.resync(repair=stack.broker is not None)
            with log_fields(env=env, service="up"):
                broker_exited = await _supervise(
                    settings, stack, registry, env, len(envs), _chosen(services, only), stop
                )
            if not broker_exited:
                break
            log.error(
                "broker tansu on %s exited: services stopped; starting it again with its history",
                settings.bootstrap_servers,
            )
    finally:
        await stack.close()


def _chosen(services: dict[str, Service], only: list[str]) -> list[Service]:
    if only:
        return [s for s in services.values() if s.name in only]
    return [s for s in services.values() if s.in_up]


async def _supervise(
    settings: Settings,
    stack: Stack,
    registry: EnvRegistry,
    env: str,
    n_envs: int,
    chosen: list[Service],
    stop: asyncio.Event,
) -> bool:
    """Run the services under supervision until SIGTERM, a fatal failure, the env's
    deletion, or the exit of a broker with a journal; raise (exit non-zero) for the
    second and third, naming what stopped; True for the last (the caller starts the
    broker again, refilled, and then the services: none may meet it empty)."""
    assert stack.postgres is not None
    dsn = stack.postgres.dsn
    ending = asyncio.Event()  # this round's end; `stop` (SIGTERM) ends it too
    broker_gone = asyncio.Event()
    backoff = Backoff(max_s=settings.restart_backoff_max_s)
    own = CollectorRegistry(auto_describe=True)
    service_metrics = ServiceMetrics(own, env)
    # every service's metrics, and up's /healthz and /readyz (bus, Postgres, each service)
    metrics = MetricsServer(
        settings.metrics_host,
        settings.metrics_port,
        readiness=lambda: readiness(
            bus, {s.name: s.state for s in supervised}, postgres=fence.holds
        ),
    )
    metrics.add(own)
    bus = BusWatch(
        settings.bootstrap_servers,
        ending,
        probe_s=settings.bus_probe_s,
        # a broker with a journal is started again by the caller, not under running services
        broker=stack.broker if stack.journal is None else None,
        on_restart=functools.partial(registry.resync, repair=True),
        backoff=backoff,
        metrics=service_metrics,
    )

    def make_ctx(own_stop: asyncio.Event, reg: CollectorRegistry) -> ServiceContext:
        return ServiceContext(settings, env, dsn, stop=own_stop, metrics=reg, bus=bus.up)

    supervised = [
        Supervised(svc, make_ctx, ending, env=env, backoff=backoff, metrics=service_metrics)
        for svc in chosen
    ]
    for s in supervised:
        metrics.add(s.registry)
    async with EnvFence(settings, dsn, env, ending, [s.name for s in chosen]) as fence:
        try:
            await metrics.start()
        except OSError as err:
            raise UserError(
                f"cannot serve metrics on {metrics.host}:{metrics.port} ({err.strerror}); "
                "set DLROVER_EVENTS_METRICS_PORT (0: any free port)"
            ) from None
        # the journal's copy ends after the services (it copies what they wrote last); each
        # is told by `ending`, given its grace, then cancelled; a SIGTERM (`stop`) ends all
        async with (
            background(_set_on(ending, stop), name="signalled"),
            background() as copying,
            background() as running,
        ):
            running.start(bus.run(), name="bus")
            for s in supervised:
                running.start(s.run(), name=s.name)
            if stack.journal is not None and stack.broker is not None:
                running.start(_watch_broker(stack.broker, broker_gone, ending), name="broker")
            if stack.journal is not None:
                copying.start(stack.journal.run(ending), name="journal")
            try:
                await _wait_ready(supervised, ending)
                if not ending.is_set():
                    _print_where(settings, stack, env, n_envs, supervised, metrics)
                await wait_for_any([ending, broker_gone, *(s.failed for s in supervised)])
            finally:
                ending.set()
                await end_within(running, STOP_GRACE_S + 5)
                await end_within(copying, 5)
                await metrics.stop()
    if fence.reason is not None:
        raise UserError(f"{fence.reason}; `up` stopped its services")
    for s in supervised:
        if s.fatal is not None:
            raise UserError(f"service {s.name} stopped: {s.fatal}")
    if broker_gone.is_set() and not stop.is_set():
        return True
    Console(stderr=True).print("stopped cleanly")
    return False


async def _watch_broker(broker: Broker, gone: asyncio.Event, ending: asyncio.Event) -> None:
    while not ending.is_set():
        if broker.exit_code() is not None:
            gone.set()
            return
        await wait_or_stop(ending, 0.25)


async def _set_on(target: asyncio.Event, event: asyncio.Event) -> None:
    """``target`` set once ``event`` is: a SIGTERM ends this round of `up`."""
    await event.wait()
    target.set()


async def _wait_ready(supervised: list[Supervised], stop: asyncio.Event) -> None:
    """Until every service said ready once, one failed for good, or SIGTERM."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not stop.is_set():
        waiting = [s for s in supervised if not s.ready.is_set()]
        if not waiting or any(s.failed.is_set() for s in supervised):
            return
        if time.monotonic() >= deadline:
            why = "; ".join(f"{s.name}: {s.last_error or s.state.value}" for s in waiting)
            raise UserError(f"not ready within {READY_TIMEOUT_S:.0f}s: {why}")
        await wait_or_stop(stop, 0.1)


def _print_where(
    settings: Settings,
    stack: Stack,
    env: str,
    n_envs: int,
    supervised: list[Supervised],
    server: MetricsServer,
) -> None:
    console = Console()
    table = Table("part", "where", title="dlrover-events is up")
    broker = f"tansu (embedded, pid {stack.broker.pid})" if stack.broker else "external"
    table.add_row(f"Kafka: {broker}", settings.bootstrap_servers)
    if stack.broker is not None:
        kept = (
            f"kept in Postgres (database {settings.broker_database}): back after a restart"
            if stack.journal is not None
            else "in memory only: gone when `up` stops"
        )
        table.add_row("  its records", kept)
    assert stack.postgres is not None
    table.add_row(f"Postgres: {stack.postgres.kind}", _redact(stack.postgres.dsn))
    table.add_row("real env", f"{env} (topics {env}.*, schema env_{env.replace('-', '_')})")
    table.add_row("envs", f"{n_envs} (every env's topics made with its partitions)")
    table.add_row("data dir", str(settings.data_dir))
    table.add_row("metrics, health", f"{server.base_url}/metrics  /healthz  /readyz")
    for s in supervised:
        table.add_row("service", s.name)
        if s.ctx is not None:
            for what, where in s.ctx.endpoints.items():
                table.add_row(f"  {what}", where)
    console.print(table)
    console.print(
        f"tail it: dlrover-events tail --env {env} --from-beginning"
        + (
            f"  (with DLROVER_EVENTS_BOOTSTRAP_SERVERS={settings.bootstrap_servers})"
            if settings.bootstrap_servers != "127.0.0.1:9092"
            else ""
        )
    )
    console.print("Ctrl-C stops everything.")
