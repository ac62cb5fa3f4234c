"""The searcher as a service of `up` and as `dlrover-events searcher --env E`: one
consumer group (``<env>.searcher``) over the experiments, the trials' metrics, the
operator's answers to job requests and the jobs' lifecycle events; decisions on
``<env>.trial.decisions``, their effects on ``<env>.job.requests`` and ``<env>.scale.plans``
(processor.py: how a batch is decided, checkpointed and published).

It must outlive any record and any outage, as the archiver does: a failure is logged with
its reason and the searcher starts again from its checkpoint after a backoff. At each start
it publishes what its outbox holds (decided before a crash, not yet published) and sets
back the stored offsets of a log that restarted, before it reads anything.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import typer
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from dlrover_events.bus.consumer import Consumer
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import TopicReader
from dlrover_events.bus.topics import (
    EXPERIMENTS,
    JOB_EVENTS,
    JOB_REQUESTS,
    TRIAL_METRICS,
    check_env_name,
    topic,
)
from dlrover_events.cli.params import env_name
from dlrover_events.cli.runner import run_async
from dlrover_events.lifecycle import Stopping, unless
from dlrover_events.runtime.metrics import SearcherMetrics
from dlrover_events.runtime.restarts import restart_until_stopped
from dlrover_events.runtime.services import Service, ServiceContext
from dlrover_events.runtime.standalone import serve_alone
from dlrover_events.settings import Settings, load_settings, settings_error
from dlrover_events.store import EnvStore
from streams.searcher.runtime.processor import SearcherProcessor

log = logging.getLogger(__name__)

GROUP = "searcher"
#: What the searcher reads: what users do to experiments and what trials measure (keyed
#: by experiment), the operator's answers to its requests (keyed by job name) and the
#: trials' jobs' ends (keyed by job uid).
INPUTS = (EXPERIMENTS, TRIAL_METRICS, JOB_REQUESTS, JOB_EVENTS)
PREFIX = "DLROVER_EVENTS_SEARCHER_"


class SearcherSettings(BaseSettings):
    """The searcher process's settings (DLROVER_EVENTS_SEARCHER_*)."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore")

    fetch_wait_ms: int = Field(
        default=200,
        ge=1,
        le=10_000,
        description="the broker's wait for a fetch: what a trial's report waits at most, "
        "once published, before the searcher reads it (tansu answers when the wait is "
        "over, not when data arrives): the floor of its decision latency",
    )


def load_searcher_settings(**given: Any) -> SearcherSettings:
    """DLROVER_EVENTS_SEARCHER_* under ``given``; a bad value is a SettingsError (one line)."""
    try:
        return SearcherSettings(**given)
    except ValidationError as err:
        raise settings_error(err, PREFIX) from None


def searcher_consumer(
    settings: Settings, env: str, processor: SearcherProcessor, own: SearcherSettings
) -> Consumer:
    return Consumer(
        settings,
        env,
        INPUTS,
        GROUP,
        processor.handle,
        fetch_max_wait_ms=own.fetch_wait_ms,
    )


async def _serve(
    ctx: ServiceContext,
    store: EnvStore,
    metrics: SearcherMetrics,
    own: SearcherSettings,
    healthy: asyncio.Event,
) -> None:
    async with Producer(ctx.settings) as producer:
        processor = SearcherProcessor(ctx.env, store.pool, producer, metrics=metrics)
        await processor.flush_outbox()
        names = [topic(ctx.env, t) for t in INPUTS]
        async with TopicReader(
            ctx.settings, names, client_id="searcher-recovery", require=False
        ) as reader:
            await processor.check_offsets(reader)
        async with searcher_consumer(ctx.settings, ctx.env, processor, own) as consumer:
            ctx.ready.set()
            healthy.set()
            while not ctx.stop.is_set():
                before = dict(consumer.dead_letter_kinds)
                try:
                    with metrics.batch_duration.time():
                        # a stop cuts a batch short (an outage waited out, say): what it
                        # did not commit is decided again at the next start
                        await unless(ctx.stop, consumer.poll(timeout_ms=500), "the searcher")
                except Stopping:
                    return
                for kind, count in consumer.dead_letter_kinds.items():
                    if count > before.get(kind, 0):
                        metrics.dead_letters.labels(ctx.env, kind).inc(count - before.get(kind, 0))


async def run(ctx: ServiceContext, own: SearcherSettings | None = None) -> None:
    own = own or load_searcher_settings()
    metrics = SearcherMetrics(ctx.metrics, ctx.env)
    store = await EnvStore.open(ctx.pg_dsn, ctx.env, max_size=3)
    try:
        await restart_until_stopped(
            ctx.stop,
            lambda healthy: _serve(ctx, store, metrics, own, healthy),
            what=f"searcher of env {ctx.env}",
            resumes_from="its checkpoint",
        )
    finally:
        await store.close()


service = Service(
    name="searcher",
    description="experiments' searchers: experiments and trial metrics in, trial decisions, "
    "job requests and hold plans out",
    run=run,
)


def searcher_command(
    env: str = typer.Option(
        ..., "--env", "-e", parser=env_name, help="the env whose experiments to decide on"
    ),
) -> None:
    """Run the searcher of one env alone: experiments and trial metrics in, trial
    decisions and their job requests and plans out."""
    own = load_searcher_settings()

    def say(ctx: ServiceContext) -> None:
        typer.echo(
            f"searcher of env {env} is running (metrics: {ctx.endpoints['metrics']}, "
            "/healthz and /readyz beside them); Ctrl-C stops it",
            err=True,
        )

    async def alone(ctx: ServiceContext) -> None:
        await run(ctx, own)

    run_async(serve_alone(load_settings(), check_env_name(env), "searcher", alone, on_ready=say))


__all__ = [
    "GROUP",
    "INPUTS",
    "SearcherSettings",
    "load_searcher_settings",
    "run",
    "searcher_command",
    "service",
]
