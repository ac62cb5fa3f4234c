"""The experiments recorder: an env's experiments, its searchers' decisions and its trials'
metrics, stored in the env's Postgres as they land, for `experiment describe`, `trial
metrics`, ``/v1/experiments`` and the console (dlrover_events.experiments).

It follows the archiver's delivery rule: a batch (every record one poll returned, up to
the consumer's batch size) is written in one transaction, one statement per table, before
its offsets are committed, and the writes are idempotent (event ids, decision numbers), so
a batch read again after a crash adds nothing. A record that does not decode is
dead-lettered by the consumer with the reason; a valid event its transaction cannot store
(Postgres refusing it for good) fails its batch, which the consumer then writes event by
event, dead-lettering that one. An experiment's status follows its actions and its
searcher's ``done`` (dlrover_events.experiments.rows).

It must outlive any record and any outage, as the archiver does: a failure (Postgres or
the broker away) is logged and the consumer starts again from the group's last commit.
"""

from __future__ import annotations

import asyncio
import logging

import typer

from dlrover_events.bus.consumer import Consumer, Received
from dlrover_events.bus.topics import (
    EXPERIMENTS,
    TRIAL_DECISIONS,
    TRIAL_METRICS,
    check_env_name,
)
from dlrover_events.cli.params import env_name
from dlrover_events.cli.runner import run_async
from dlrover_events.experiments.store import Batch, ExperimentStore, Recorded
from dlrover_events.runtime.restarts import restart_until_stopped
from dlrover_events.runtime.services import Service, ServiceContext
from dlrover_events.runtime.standalone import serve_alone
from dlrover_events.settings import Settings, load_settings
from dlrover_events.store import create_pool, env_schema

log = logging.getLogger(__name__)

GROUP = "experiments-recorder"
TOPICS = (EXPERIMENTS, TRIAL_DECISIONS, TRIAL_METRICS)
#: the broker's wait for a fetch: what a report waits at most, once published, before its
#: batch is read (tansu answers when the wait is over, not when data arrives)
FETCH_WAIT_MS = 200


class Tally:
    """What the recorder stored since it started (the bench and the tests read it)."""

    def __init__(self) -> None:
        self.batches = 0
        self.experiments = 0
        self.decisions = 0
        self.metrics = 0
        self.status_changes = 0
        self.ignored = 0

    def add(self, recorded: Recorded, ignored: int) -> None:
        self.batches += 1
        self.experiments += recorded.experiments
        self.decisions += recorded.decisions
        self.metrics += recorded.metrics
        self.status_changes += recorded.status_changes
        self.ignored += ignored


def recorder_consumer(
    settings: Settings, env: str, store: ExperimentStore, tally: Tally | None = None
) -> Consumer:
    """The consumer of the env's experiment topics whose handler stores each batch."""

    async def handle(received: list[Received]) -> None:
        batch = Batch()
        for item in received:
            batch.add(item.event)
        recorded = await store.record(batch)
        if tally is not None:
            tally.add(recorded, batch.other)

    return Consumer(settings, env, TOPICS, GROUP, handle, fetch_max_wait_ms=FETCH_WAIT_MS)


async def record(
    ctx: ServiceContext, store: ExperimentStore, tally: Tally, healthy: asyncio.Event
) -> None:
    """Consume and store until told to stop."""
    async with recorder_consumer(ctx.settings, ctx.env, store, tally) as consumer:
        ctx.ready.set()
        healthy.set()
        while not ctx.stop.is_set():
            await consumer.poll(timeout_ms=500)


async def run(ctx: ServiceContext, tally: Tally | None = None) -> None:
    """The recorder of ``ctx.env`` until ``ctx.stop``; a failure starts it again from the
    group's last commit after a backoff."""
    tally = tally if tally is not None else Tally()
    pool = await create_pool(ctx.pg_dsn, env_schema(ctx.env), max_size=2)
    store = ExperimentStore(pool)
    try:
        await restart_until_stopped(
            ctx.stop,
            lambda healthy: record(ctx, store, tally, healthy),
            what=f"experiments recorder of env {ctx.env}",
        )
    finally:
        await pool.close()


async def _serve(ctx: ServiceContext) -> None:
    await run(ctx)


service = Service(
    name="experiments-recorder",
    description="stores the env's experiments, trial decisions and trial metrics in its "
    "Postgres (experiment describe, trial metrics, /v1/experiments)",
    run=_serve,
)


def recorder_command(
    env: str = typer.Option(
        ..., "--env", "-e", parser=env_name, help="the env whose experiments to record"
    ),
) -> None:
    """Run the experiments recorder of one env alone: its experiments, trial decisions and
    trial metrics into the env's Postgres."""

    def say(ctx: ServiceContext) -> None:
        typer.echo(
            f"experiments recorder of env {env} is running (metrics: "
            f"{ctx.endpoints['metrics']}, /healthz and /readyz beside them); Ctrl-C stops it",
            err=True,
        )

    run_async(serve_alone(load_settings(), check_env_name(env), service.name, _serve, on_ready=say))


__all__ = [
    "GROUP",
    "TOPICS",
    "Tally",
    "record",
    "recorder_command",
    "recorder_consumer",
    "run",
    "service",
]
