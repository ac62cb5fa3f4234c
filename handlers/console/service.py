"""The console as a service of `dlrover-events up` (entry point ``console``) and as the
`dlrover-events console` command."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

import typer

from dlrover_events.cli.params import env_name
from dlrover_events.runtime.metrics import ConsoleMetrics
from dlrover_events.runtime.services import Service, ServiceContext
from dlrover_events.runtime.standalone import serve_alone
from dlrover_events.settings import load_settings
from handlers.console.runtime import ConsoleServer, ConsoleSettings

log = logging.getLogger(__name__)


async def run(ctx: ServiceContext, conf: ConsoleSettings | None = None) -> None:
    """Serve until ``ctx.stop``; ``conf`` (the `console` command's flags) over the env's."""
    async with ConsoleServer(ctx.settings, ctx.env, ctx.pg_dsn, conf) as server:
        await server.wait_ready()
        views = server.views
        ConsoleMetrics(ctx.metrics, ctx.env).clients.set_function(lambda: views.subscribers)
        log.info("web console of env %s on %s", ctx.env, server.url)
        ctx.endpoints["web console"] = (
            f"{server.url}#token=<token>  (read, or admin for actions: dlrover-events "
            f"gateway-token create --env {ctx.env} [--scope admin])"
        )
        ctx.ready.set()
        await ctx.stop.wait()


service = Service(
    name="console",
    description="web console: live tail, jobs and their timelines and charts, A/B results, "
    "dead letters, config documents; actions behind the admin token",
    run=run,
)


def console(
    env: str = typer.Option(
        ...,
        "--env",
        "-e",
        parser=env_name,
        help="The env shown first (a page shows any other env with that env's token).",
    ),
    host: str | None = typer.Option(
        None, help="Listen address (default DLROVER_EVENTS_CONSOLE_HOST, 127.0.0.1)."
    ),
    port: int | None = typer.Option(
        None, help="Port (default DLROVER_EVENTS_CONSOLE_PORT, 8480; 0: any free one)."
    ),
) -> None:
    """Serve the web console until Ctrl-C: envs, jobs, A/B results, dead letters, configs;
    actions with an admin token (tokens: `gateway-token create`)."""
    settings = load_settings()
    conf = ConsoleSettings()
    conf = conf.model_copy(
        update={"host": host or conf.host, "port": conf.port if port is None else port}
    )

    def say(ctx: ServiceContext) -> None:
        url = ctx.endpoints["web console"].split("#")[0]
        typer.echo(
            f"web console of env {env} on {url}  (open it with #token=...; "
            f"metrics: {ctx.endpoints['metrics']}, /healthz and /readyz beside them)"
        )

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            serve_alone(settings, env, "console", functools.partial(run, conf=conf), on_ready=say)
        )
