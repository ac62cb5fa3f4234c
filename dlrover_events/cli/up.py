"""`dlrover-events up`: the embedded stack in one command, stopped cleanly by Ctrl-C.

It supervises what it starts (dlrover_events.runtime.supervisor): a failed service is said and
restarted with backoff, a dead broker is said and started again, the real env's fence
stops everything if the env is deleted, and the broker dies with `up` even by SIGKILL.

It runs the services of whichever env is real: when another env is promoted (`env
promote`, the watchdog), the round of the old real env's services ends (its local operator,
demoted, leaves the jobs' processes running) and the new real env's services start, on the
same broker, ports and data dir; the new env's operator adopts the jobs. With
DLROVER_EVENTS_WATCHDOG_STANDBY set, it makes that standby (virtual, with the real env's
settings) unless it exists.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from rich.console import Console
from rich.table import Table

from dlrover_events.backoff import Backoff
from dlrover_events.cli.runner import run_async
from dlrover_events.envs.control import RETRY, EnvWatcher
from dlrover_events.envs.failover import standby_name, standby_to_make
from dlrover_events.envs.registry import EnvRecord, EnvRegistry
from dlrover_events.errors import EnvError, UserError
from dlrover_events.lifecycle import background, end_within, wait_for_any, wait_or_stop
from dlrover_events.runtime import logs
from dlrover_events.runtime.broker_journal import BrokerJournal, database_identity
from dlrover_events.runtime.embedded import Broker, Postgres, ensure_database, resolve_postgres
from dlrover_events.runtime.fence import EnvFence
from dlrover_events.runtime.logs import log_fields
from dlrover_events.runtime.metrics import MetricsServer, Readiness, ServiceMetrics
from dlrover_events.runtime.services import Service, ServiceContext, discover_services
from dlrover_events.runtime.supervisor import (
    STOP_GRACE_S,
    BusWatch,
    Supervised,
    readiness,
)
from dlrover_events.settings import Settings, load_settings
from dlrover_events.store.database import _redact, connect
from schemas.control import EnvMode

log = logging.getLogger(__name__)

#: how long `up` waits for every service to say ready before it gives up
READY_TIMEOUT_S = 60.0
#: a service's stop grace once the broker died: what it would still write reaches nothing
BROKER_GONE_GRACE_S = 1.0


@dataclass
class Stack:
    settings: Settings
    broker: Broker | None = None
    postgres: Postgres | None = None
    #: the embedded broker's records in Postgres (broker_storage=postgres)
    journal: BrokerJournal | None = None
    #: /metrics, /healthz and /readyz, served for as long as `up` runs
    server: MetricsServer | None = None

    async def start_broker(self, stop: asyncio.Event) -> bool:
        """Start the embedded broker and, with a journal, refill it with its history.

        A broker that does not start, or a refill that fails (Postgres away, a broker that
        dies under it), is one log line and another try on a new broker, with backoff, until
        it works or `stop`: the stack's supervision never ends because of it. False if
        stopped first."""
        assert self.broker is not None
        backoff = Backoff(max_s=self.settings.restart_backoff_max_s)
        failures = 0
        while not stop.is_set():
            try:
                if self.journal is not None:
                    await self.journal.say_restarting()
                await self.broker.start_async()  # from this (the main) thread: see Broker
                if self.journal is not None:
                    refill = await self.journal.refill()
                    log.warning(
                        "broker refilled from its journal (%s): %d topics, %d records, "
                        "%d groups' commits in %.1fs",
                        self.journal.where,
                        refill.topics,
                        refill.records,
                        refill.groups,
                        refill.seconds,
                    )
                return True
            except Exception as err:
                failures += 1
                delay = backoff.delay(failures)
                log.error(
                    "broker on %s not started with its history (%s: %s); a new broker in %.1fs",
                    self.broker.bootstrap_servers,
                    type(err).__name__,
                    err,
                    delay,
                )
                self.broker.kill()  # a broker half refilled must not be served
                await wait_or_stop(stop, delay)
        return False

    async def close(self) -> None:
        if self.server is not None:
            await self.server.stop()
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
                stack.journal = await _open_journal(settings, dsn)
        registry = EnvRegistry(settings, dsn)
        probes = Probes()
        server = MetricsServer(settings.metrics_host, settings.metrics_port, readiness=probes.ready)
        server.add(probes)
        try:
            await server.start()
        except OSError as err:
            raise UserError(
                f"cannot serve metrics on {server.host}:{server.port} ({err.strerror}); "
                "set DLROVER_EVENTS_METRICS_PORT (0: any free port)"
            ) from None
        stack.server = server
        fresh_broker = True  # a round after a switch keeps the broker it has
        while not stop.is_set():
            if fresh_broker and stack.broker is not None and not await stack.start_broker(stop):
                break
            real = await registry.real()
            env = real.name if real else settings.default_env
            record = await registry.create(env, EnvMode.REAL, exist_ok=True)
            await _ensure_standby(registry, record)
            envs = await registry.resync(repair=stack.broker is not None and fresh_broker)
            with log_fields(env=env, service="up"):
                end = await _supervise(
                    settings, stack, registry, env, len(envs), _chosen(services, only), stop, probes
                )
            if end == RoundEnd.STOPPED:
                break
            fresh_broker = end == RoundEnd.BROKER_EXITED
            if fresh_broker:
                log.error(
                    "broker tansu on %s exited: services stopped; starting it again with its "
                    "history",
                    settings.bootstrap_servers,
                )
    finally:
        await stack.close()


class RoundEnd(StrEnum):
    """Why a round of services ended: `up` stops, or starts the next round."""

    STOPPED = "stopped"
    #: the broker (with a journal) died: it is started again, refilled, then the services
    BROKER_EXITED = "broker exited"
    #: another env was promoted: its services start, on the same broker
    SWITCHED = "switched"


async def _ensure_standby(registry: EnvRegistry, real: EnvRecord) -> None:
    """The watchdog's standby, made (virtual, with the real env's settings as stored now)
    unless it exists: a watchdog must have something ready to promote."""
    todo = standby_to_make(
        standby_name(), real.name, real.settings, [e.name for e in await registry.list()]
    )
    if todo is None:
        return
    try:
        made = await registry.create(todo.name, EnvMode.VIRTUAL, settings=todo.settings)
    except EnvError as err:  # made by another process meanwhile, or a name it refuses
        log.warning("the watchdog's standby env %s was not made: %s", todo.name, err)
        return
    log.warning(
        "made the watchdog's standby env %s (virtual, %d partitions, the settings of %s)",
        made.name,
        made.partitions,
        real.name,
    )


async def _follow_real(
    settings: Settings,
    registry: EnvRegistry,
    env: str,
    switched: asyncio.Event,
    ending: asyncio.Event,
) -> None:
    """End the round once another env is real. dlrover.control says when to look (within
    a fetch of a promotion); the registry, the system of record, says whether it is so (an
    announcement read while catching up may be an old one)."""
    look = asyncio.Event()
    failures = 0
    while not ending.is_set():
        watcher = EnvWatcher(settings, on_change=lambda _: look.set())
        try:
            async with background(watcher.run(ending), name="up.control") as (task,):
                while not ending.is_set():
                    await wait_for_any([look, ending], [task])
                    if task.done():
                        task.result()  # its failure, retried below
                        return
                    look.clear()
                    real = await registry.real()
                    if real is not None and real.name != env:
                        log.warning(
                            "env %s is the real env now (%s was): `up` stops %s's services and "
                            "starts %s's",
                            real.name,
                            env,
                            env,
                            real.name,
                        )
                        switched.set()
                        ending.set()
                        return
        except Exception as err:  # the bus or Postgres away: BusWatch and the fence say so
            failures += 1
            delay = RETRY.delay(failures)
            log.warning("following which env is real: %s; again in %.1fs", err, delay)
            await wait_or_stop(ending, delay)


class Probes(CollectorRegistry):
    """What `up`'s one metrics server answers across its rounds (a broker that died ends a
    round: its services stop, the broker is refilled, they start again): the current
    round's metrics and readiness, and between rounds not ready, with why. Before, each
    round served its own and the server of a round that was ending still said ready from
    services that were stopping (issue 37: 200 for 10 s after the broker's death)."""

    def __init__(self) -> None:
        super().__init__(auto_describe=True)
        self.registries: list[CollectorRegistry] = []
        self.readiness: Readiness | None = None
        self.between = "starting: the broker and the services are not up yet"

    def collect(self) -> Iterable[Metric]:
        for registry in self.registries:
            yield from registry.collect()

    def ready(self) -> tuple[bool, dict[str, Any]]:
        if self.readiness is None:
            return False, {"bus": False, "services": {}, "reason": self.between}
        return self.readiness()


async def _open_journal(settings: Settings, dsn: str) -> BrokerJournal:
    """The journal of this stack: in its own database unless `broker_database` names
    another, which must then be this stack's (the journal says whose it is)."""
    if not settings.broker_database:
        return await BrokerJournal.open(settings, dsn)
    conn = await connect(dsn)
    try:
        stack = await database_identity(conn)
    finally:
        await conn.close()
    journal_dsn = await ensure_database(dsn, settings.broker_database)
    return await BrokerJournal.open(settings, journal_dsn, stack=stack)


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
    probes: Probes,
) -> RoundEnd:
    """Run the services under supervision until SIGTERM, a fatal failure, the env's
    deletion, the exit of a broker with a journal, or the promotion of another env; raise
    (exit non-zero) for the second and third, naming what stopped; BROKER_EXITED for the
    fourth (the caller starts the broker again, refilled, and then the services: none may
    meet it empty), SWITCHED for the last (the caller starts the new real env's)."""
    assert stack.postgres is not None
    dsn = stack.postgres.dsn
    ending = asyncio.Event()  # this round's end; `stop` (SIGTERM) ends it too
    broker_gone = asyncio.Event()
    switched = asyncio.Event()
    backoff = Backoff(max_s=settings.restart_backoff_max_s)
    own = CollectorRegistry(auto_describe=True)
    service_metrics = ServiceMetrics(own, env)

    def ready() -> tuple[bool, dict[str, Any]]:
        """up's /readyz: the bus, Postgres, each service; not ready from the moment the
        broker is seen dead (0.25 s), whatever the services still say while they stop."""
        if broker_gone.is_set():
            return False, {
                "bus": False,
                "services": {s.name: s.state.value for s in supervised},
                "reason": f"broker on {settings.bootstrap_servers} exited: starting it again",
            }
        return readiness(bus, {s.name: s.state for s in supervised}, postgres=fence.holds)

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
    assert stack.server is not None
    async with EnvFence(settings, dsn, env, ending, [s.name for s in chosen]) as fence:
        # every service's metrics, and up's /healthz and /readyz
        probes.registries = [own, *(s.registry for s in supervised)]
        probes.readiness = ready
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
            running.start(
                _follow_real(settings, registry, env, switched, ending), name="follow real"
            )
            try:
                await _wait_ready(supervised, ending)
                if not ending.is_set():
                    _print_where(settings, stack, env, n_envs, supervised, stack.server)
                await wait_for_any([ending, broker_gone, *(s.failed for s in supervised)])
            finally:
                if broker_gone.is_set():
                    # the broker is gone: no stop grace, it is restarted at once
                    for s in supervised:
                        s.grace_s = BROKER_GONE_GRACE_S
                ending.set()
                await end_within(running, STOP_GRACE_S + 5)
                await end_within(copying, 5)
                probes.readiness = None
                probes.between = (
                    f"broker on {settings.bootstrap_servers} exited: starting it again"
                    if broker_gone.is_set()
                    else "another env was promoted: starting its services"
                    if switched.is_set()
                    else "stopping"
                )
    if fence.reason is not None:
        raise UserError(f"{fence.reason}; `up` stopped its services")
    for s in supervised:
        if s.fatal is not None:
            raise UserError(f"service {s.name} stopped: {s.fatal}")
    if broker_gone.is_set() and not stop.is_set():
        return RoundEnd.BROKER_EXITED
    if switched.is_set() and not stop.is_set():
        return RoundEnd.SWITCHED
    Console(stderr=True).print("stopped cleanly")
    return RoundEnd.STOPPED


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
            f"kept in Postgres ({stack.journal.where}): back after a restart"
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
    example = Path("examples/elastic/job.yaml")
    if example.is_file() and any(s.name == "local" for s in supervised):
        # a newcomer's next step (README, "the first five minutes"), from the repository:
        # the local platform's operator runs it
        console.print(f"run a job: dlrover-events job submit {example} --platform local")
    console.print("Ctrl-C stops everything.")
