"""`up`'s supervision: its services and its bus are watched, failures said at once.

Before, a dead broker could leave `up` saying "stopped cleanly", or up for minutes with
no log line while its health endpoints said ok, and one failed service took every other
down with it. Here:

- a service that fails (or returns while `up` runs) is logged by name with why, and
  started again after a backoff (0.5 s doubling up to ``restart_backoff_max_s``; reset
  once it ran a minute); a user mistake (a UserError other than an unreachable bus or
  Postgres) is not retried: `up` stops and exits non-zero naming the service;
- the bus is probed every ``bus_probe_s``; an embedded broker that exits is logged with
  its exit code and started again on its port (with backoff), and every env's topics are
  re-created; while the bus is away /readyz answers 503 and ``ctx.bus`` is clear;
- every wait is also a wait on the stop event, so SIGTERM ends all of it within seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sized
from enum import StrEnum
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from dlrover_events.backoff import Backoff
from dlrover_events.errors import BusUnavailable, StoreUnavailable, UserError
from dlrover_events.lifecycle import cancel_and_wait, end_within, wait_for_any, wait_or_stop
from dlrover_events.runtime.embedded import Broker, kafka_reachable
from dlrover_events.runtime.logs import log_fields
from dlrover_events.runtime.metrics import ServiceMetrics
from dlrover_events.runtime.services import Service, ServiceContext

log = logging.getLogger(__name__)

#: how long a stopping service may take before it is cancelled
STOP_GRACE_S = 10.0


def is_fatal(err: BaseException | None) -> bool:
    """Whether a service's failure is one a restart cannot mend (pure): a user mistake.
    An unreachable bus or Postgres is a UserError too, but one that time mends."""
    return isinstance(err, UserError) and not isinstance(err, BusUnavailable | StoreUnavailable)


class State(StrEnum):
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


class RegistrySlot(CollectorRegistry):
    """The registry of a service's current run: each restart gets a fresh registry (a
    service declares its metrics anew on every start) behind one that the server keeps."""

    def __init__(self) -> None:
        super().__init__(auto_describe=True)
        self.current = CollectorRegistry(auto_describe=True)

    def renew(self) -> CollectorRegistry:
        self.current = CollectorRegistry(auto_describe=True)
        return self.current

    def collect(self) -> Iterable[Metric]:
        return self.current.collect()


class Supervised:
    """One service of `up`, started again with backoff when it fails."""

    def __init__(
        self,
        service: Service,
        make_ctx: Callable[[asyncio.Event, CollectorRegistry], ServiceContext],
        stop: asyncio.Event,
        *,
        env: str,
        backoff: Backoff = Backoff(),
        metrics: ServiceMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self.name = service.name
        self._make_ctx = make_ctx
        self._stop = stop
        self._env = env
        self._backoff = backoff
        self._metrics = metrics
        self._clock = clock
        self.state = State.STARTING
        self.failures = 0
        self.restarts = 0
        self.last_error = ""
        #: set once the first run said ready (`up` waits for it before printing where)
        self.ready = asyncio.Event()
        #: set when the service failed for good (a user mistake): `up` stops
        self.fatal: BaseException | None = None
        self.failed = asyncio.Event()
        self.registry = RegistrySlot()
        self.ctx: ServiceContext | None = None
        #: how long a stop may take before the service is cancelled: `up` shortens it when
        #: its broker died (nothing a service could still write would reach it)
        self.grace_s = STOP_GRACE_S

    def _gauge(self, value: int) -> None:
        if self._metrics is not None:
            self._metrics.up.labels(self._env, self.name).set(value)

    async def run(self) -> None:
        while not self._stop.is_set():
            own_stop = asyncio.Event()
            ctx = self._make_ctx(own_stop, self.registry.renew())
            self.ctx = ctx
            started = self._clock()
            self.state = State.STARTING
            with log_fields(env=self._env, service=self.name):
                task = asyncio.create_task(self.service.run(ctx), name=self.name)
            ready = asyncio.create_task(self._on_ready(ctx))
            self._gauge(1)
            try:
                await wait_for_any([self._stop], [task])
            finally:
                ready.cancel()
            if not task.done():  # `up` stops
                await self._end(task, own_stop)
                break
            self._gauge(0)
            err = None if task.cancelled() else task.exception()
            if self._stop.is_set():
                break
            if is_fatal(err):
                self.fatal = err
                self.state = State.FAILED
                self.last_error = str(err)
                log.error("service %s stopped: %s", self.name, err)
                self.failed.set()
                return
            ran = self._clock() - started
            self.failures = self._backoff.failures_after(self.failures, ran)
            delay = self._backoff.delay(self.failures)
            self.last_error = (
                f"failed: {type(err).__name__}: {err}"
                if err is not None
                else "returned although `up` still runs"
            )
            self.state = State.RESTARTING
            log.error(
                "service %s %s; restarting in %.1fs (failure %d in a row)",
                self.name,
                self.last_error,
                delay,
                self.failures,
                exc_info=err if err is not None and not isinstance(err, UserError) else None,
            )
            if await wait_or_stop(self._stop, delay):
                break
            self.restarts += 1
            if self._metrics is not None:
                self._metrics.restarts.labels(self._env, self.name).inc()
        self.state = State.STOPPED
        self._gauge(0)

    async def _on_ready(self, ctx: ServiceContext) -> None:
        await ctx.ready.wait()
        self.state = State.READY
        if self.restarts:
            log.warning("service %s is ready again", self.name)
        self.ready.set()

    async def _end(self, task: asyncio.Task[None], own_stop: asyncio.Event) -> None:
        own_stop.set()
        if await end_within([task], self.grace_s) and self.grace_s >= STOP_GRACE_S:
            log.warning("service %s did not stop within %.0fs: cancelled", self.name, self.grace_s)


class BusWatch:
    """Probes the bus; restarts an embedded broker that exited, then ``on_restart``.

    Besides a probe every ``probe_s``, it holds one idle connection to the broker: a broker
    that dies closes it, which says so at once (within a tick, 0.25 s), even when the broker
    is back on its port before the next probe (`up` restarts its broker within a second or
    two, and a probe that found the port open said ready from an empty broker). ``held``,
    when given, says why a broker that answers is not usable yet (its refill from the
    journal), or None."""

    def __init__(
        self,
        bootstrap_servers: str,
        stop: asyncio.Event,
        *,
        probe_s: float = 1.0,
        broker: Broker | None = None,
        on_restart: Callable[[], Awaitable[Sized]] | None = None,
        backoff: Backoff = Backoff(),
        metrics: ServiceMetrics | None = None,
        held: Callable[[], Awaitable[str | None]] | None = None,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._stop = stop
        self._probe_s = probe_s
        self._broker = broker
        self._on_restart = on_restart
        self._backoff = backoff
        self._metrics = metrics
        self._held = held
        #: set while the bus answers
        self.up = asyncio.Event()
        self.up.set()
        self._away_since: float | None = None
        self._resync_pending = False
        self._watch: asyncio.Task[None] | None = None
        self._set_gauge(1)

    def _set_gauge(self, value: int) -> None:
        if self._metrics is not None:
            self._metrics.bus_up.set(value)

    def _away(self, why: str) -> None:
        self.up.clear()
        self._set_gauge(0)
        if self._away_since is None:
            self._away_since = time.monotonic()
            log.error("%s: services wait for it and /readyz says not ready", why)

    def _back(self) -> None:
        if self._away_since is not None:
            log.warning(
                "bus at %s answers again after %.0fs",
                self.bootstrap_servers,
                time.monotonic() - self._away_since,
            )
            self._away_since = None
        self.up.set()
        self._set_gauge(1)

    async def run(self) -> None:
        tick = min(0.25, self._probe_s)
        next_probe = 0.0
        try:
            while not await wait_or_stop(self._stop, tick):
                if self._broker is not None and (code := self._broker.exit_code()) is not None:
                    self._away(
                        f"broker tansu (pid {self._broker.pid}) on {self.bootstrap_servers} "
                        f"exited with code {code}; starting it again"
                    )
                    await self._restart_broker()
                    continue
                if self._resync_pending:
                    await self._resync()
                lost = self._watch is not None and self._watch.done()
                if lost:
                    self._watch = None
                    self._away(
                        f"bus at {self.bootstrap_servers} does not answer (connection closed)"
                    )
                if lost or self._away_since is not None or time.monotonic() >= next_probe:
                    next_probe = time.monotonic() + self._probe_s
                    await self._probe()
        finally:
            if self._watch is not None:
                await cancel_and_wait(self._watch)

    async def _probe(self) -> None:
        if not await asyncio.to_thread(kafka_reachable, self.bootstrap_servers):
            self._away(f"bus at {self.bootstrap_servers} does not answer")
            return
        why = await self._held() if self._held is not None else None
        if why is not None:
            self._away(why)
            return
        if self._watch is None:
            self._watch = asyncio.create_task(self._hold_connection(), name="bus watch")
        self._back()

    async def _hold_connection(self) -> None:
        """Returns when the broker closes the connection (or it cannot be opened)."""
        host, _, port = self.bootstrap_servers.split(",")[0].strip().rpartition(":")
        try:
            reader, writer = await asyncio.open_connection(host or "127.0.0.1", int(port))
        except (OSError, ValueError):
            return
        try:
            await reader.read(1)  # the broker never speaks first: only its end returns
        except OSError:
            pass
        finally:
            writer.close()

    async def _restart_broker(self) -> None:
        assert self._broker is not None
        failures = 0
        while not self._stop.is_set():
            try:
                await self._broker.start_async()
            except UserError as err:
                failures += 1
                delay = self._backoff.delay(failures)
                log.error("broker did not start again: %s; retrying in %.1fs", err, delay)
                await wait_or_stop(self._stop, delay)
                continue
            log.warning(
                "broker started again on %s (pid %d); its topics were lost (memory storage)",
                self.bootstrap_servers,
                self._broker.pid,
            )
            self._resync_pending = True
            await self._resync()
            return

    async def _resync(self) -> None:
        if self._on_restart is None:
            self._resync_pending = False
            return
        try:
            envs = await self._on_restart()
        except UserError as err:
            log.error("could not re-create the envs' topics (%s); retrying", err)
            return
        log.warning("topics of every env (%d) re-created with their partitions", len(envs))
        self._resync_pending = False
        self._back()


def readiness(
    bus: BusWatch,
    services: Mapping[str, State],
    postgres: asyncio.Event | None = None,
) -> tuple[bool, dict[str, Any]]:
    """What /readyz answers (pure over the states it is given): ready while the bus
    answers, Postgres answers (when watched: ``postgres`` set) and every service is ready;
    otherwise a ``reason`` a person can act on. One implementation for `up` and for a
    service run as its own command (`standalone`)."""
    why = [] if bus.up.is_set() else [f"bus at {bus.bootstrap_servers} does not answer"]
    if postgres is not None and not postgres.is_set():
        why.append("Postgres does not answer")
    why += [
        f"service {name} is {state.value}"
        for name, state in services.items()
        if state != State.READY
    ]
    body: dict[str, Any] = {
        "bus": bus.up.is_set(),
        "services": {name: state.value for name, state in services.items()},
    }
    if postgres is not None:
        body["postgres"] = postgres.is_set()
    if why:
        body["reason"] = "; ".join(why)
    return not why, body
