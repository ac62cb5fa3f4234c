"""The event archive: every valid event of an env, once, in the env's Postgres.

It is the simplest stream processor there is and shows the delivery rule every other one
follows: the batch is written (idempotently, by event_id) before its offsets are committed.

It must outlive any record and any outage: under `up`, a service that raises stops the
stack. A failure (Postgres or the broker away, a letter the broker refuses) is logged with
its reason, and the consumer starts again from the group's last commit after a backoff,
so nothing past the commit is skipped and nothing before it is archived twice.
"""

from __future__ import annotations

import asyncio
import logging

import typer

from dlrover_events.bus.consumer import Consumer, Received
from dlrover_events.bus.topics import ENV_TOPIC_NAMES, check_env_name
from dlrover_events.cli.params import env_name
from dlrover_events.cli.runner import run_async
from dlrover_events.runtime.metrics import ArchiverMetrics
from dlrover_events.runtime.restarts import restart_until_stopped
from dlrover_events.runtime.services import Service, ServiceContext
from dlrover_events.runtime.standalone import serve_alone
from dlrover_events.settings import Settings, load_settings
from dlrover_events.store import EnvStore

log = logging.getLogger(__name__)

GROUP = "archiver"


def archiver_consumer(
    settings: Settings, env: str, store: EnvStore, metrics: ArchiverMetrics | None = None
) -> Consumer:
    async def handle(batch: list[Received]) -> None:
        await store.archive(batch)
        if metrics is not None:
            metrics.records.inc(len(batch))

    return Consumer(settings, env, ENV_TOPIC_NAMES, GROUP, handle)


async def _consume(
    ctx: ServiceContext, store: EnvStore, metrics: ArchiverMetrics, healthy: asyncio.Event
) -> None:
    async with archiver_consumer(ctx.settings, ctx.env, store, metrics) as consumer:
        ctx.ready.set()
        healthy.set()
        while not ctx.stop.is_set():
            before = dict(consumer.dead_letter_kinds)
            with metrics.batch_duration.time():
                await consumer.poll(timeout_ms=500)
            for kind, count in consumer.dead_letter_kinds.items():
                if count > before.get(kind, 0):
                    metrics.dead_letters.labels(ctx.env, kind).inc(count - before.get(kind, 0))


async def run(ctx: ServiceContext) -> None:
    metrics = ArchiverMetrics(ctx.metrics, ctx.env)
    store = await EnvStore.open(ctx.pg_dsn, ctx.env, max_size=2)
    try:
        await restart_until_stopped(
            ctx.stop,
            lambda healthy: _consume(ctx, store, metrics, healthy),
            what=f"archiver of env {ctx.env}",
        )
    finally:
        await store.close()


service = Service(
    name="archiver",
    description="writes every valid event of the env to its events_archive table",
    run=run,
)


def archiver_command(
    env: str = typer.Option(
        ..., "--env", "-e", parser=env_name, help="the env whose events to archive"
    ),
) -> None:
    """Run the archiver of one env alone: every valid event into the env's Postgres."""

    def say(ctx: ServiceContext) -> None:
        typer.echo(
            f"archiver of env {env} is running (metrics: {ctx.endpoints['metrics']}, /healthz "
            "and /readyz beside them); Ctrl-C stops it",
            err=True,
        )

    run_async(serve_alone(load_settings(), check_env_name(env), "archiver", run, on_ready=say))
