"""`dlrover-events up`: the embedded stack in one command, stopped cleanly by Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass, field

import typer
from rich.console import Console
from rich.table import Table

from dlrover_events.cli.app import run_async
from dlrover_events.embedded import Broker, Postgres, resolve_postgres
from dlrover_events.envs import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.services import ServiceContext, discover_services
from dlrover_events.settings import Settings, load_settings
from dlrover_events.store.database import _redact
from schemas.control import EnvMode

log = logging.getLogger(__name__)


@dataclass
class Stack:
    settings: Settings
    broker: Broker | None = None
    postgres: Postgres | None = None
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def close(self) -> None:
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
    """
    run_async(_up(load_settings(), only or []))


async def _up(settings: Settings, only: list[str]) -> None:
    services = discover_services()
    unknown = sorted(set(only) - set(services))
    if unknown:
        raise UserError(f"unknown service(s) {', '.join(unknown)}; known: {', '.join(services)}")
    stack = Stack(settings)
    try:
        if "bootstrap_servers" not in settings.model_fields_set:
            stack.broker = Broker(settings.host, settings.broker_port, settings.data_dir / "logs")
            await asyncio.to_thread(stack.broker.start)
            settings = settings.with_overrides(bootstrap_servers=stack.broker.bootstrap_servers)
        stack.postgres = await resolve_postgres(settings)
        registry = EnvRegistry(settings, stack.postgres.dsn)
        real = await registry.real()
        env = real.name if real else settings.default_env
        await registry.create(env, EnvMode.REAL, exist_ok=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        chosen = [s for s in services.values() if (s.name in only) if only] or [
            s for s in services.values() if s.in_up
        ]
        contexts = {}
        for svc in chosen:
            ctx = ServiceContext(settings, env, stack.postgres.dsn, stop=stop)
            contexts[svc.name] = ctx
            stack.tasks[svc.name] = asyncio.create_task(svc.run(ctx), name=svc.name)
        await _wait_ready(contexts, stack.tasks)
        _print_where(settings, stack, env, contexts)
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait(
            [waiter, *stack.tasks.values()], return_when=asyncio.FIRST_COMPLETED
        )
        failed = [t for t in done if t is not waiter and t.exception() is not None]
        stop.set()
        await _finish(stack.tasks)
        for t in failed:
            raise UserError(f"service {t.get_name()} stopped: {t.exception()}")
        Console(stderr=True).print("stopped cleanly")
    finally:
        stack.close()


async def _wait_ready(
    contexts: dict[str, ServiceContext], tasks: dict[str, asyncio.Task[None]]
) -> None:
    for name, ctx in contexts.items():
        ready = asyncio.create_task(ctx.ready.wait())
        done, _ = await asyncio.wait(
            {ready, tasks[name]}, timeout=60, return_when=asyncio.FIRST_COMPLETED
        )
        if tasks[name] in done:
            ready.cancel()
            tasks[name].result()  # raises what stopped it
        elif ready not in done:
            ready.cancel()
            raise UserError(f"service {name} was not ready within 60s")


async def _finish(tasks: dict[str, asyncio.Task[None]]) -> None:
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks.values(), timeout=10)
    for t in pending:
        t.cancel()
    for t in pending:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t


def _print_where(
    settings: Settings, stack: Stack, env: str, contexts: dict[str, ServiceContext]
) -> None:
    console = Console()
    table = Table("part", "where", title="dlrover-events is up")
    broker = "tansu (embedded)" if stack.broker else "external"
    table.add_row(f"Kafka: {broker}", settings.bootstrap_servers)
    assert stack.postgres is not None
    table.add_row(f"Postgres: {stack.postgres.kind}", _redact(stack.postgres.dsn))
    table.add_row("real env", f"{env} (topics {env}.*, schema env_{env.replace('-', '_')})")
    for name, ctx in contexts.items():
        table.add_row("service", name)
        for what, where in ctx.endpoints.items():
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
