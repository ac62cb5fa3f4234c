"""The checkpoints service of an env: the catalog and its retention, in one place.

One consumer group (``<env>.checkpoints``) over ``<env>.checkpoints``. Each batch is
recorded in the env's Postgres (idempotent on the checkpoint's id) and the retention
policy is decided for the jobs and experiments it touched, in the database
(dlrover_events.checkpoints.store: the rows it deletes are marked ``deleting`` in the
transaction that holds them, so a model version registered meanwhile is seen); only then
are the offsets committed. Beside the consumer, the deleter removes the files of every
``deleting`` checkpoint through fsspec, publishes a CheckpointDeleted saying which and
why, and marks the row deleted. A storage that fails leaves the row ``deleting``: the
deleter tries again every ``retry_s``, and a restarted service finishes what a killed
one started (a URL already empty counts as removed).

A failure of the consumer (Postgres or the broker away) is logged and the service starts
again from the group's last commit, as the experiments recorder does.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

import typer
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from dlrover_events.bus.consumer import Consumer, Received
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import CHECKPOINTS, check_env_name
from dlrover_events.checkpoints.retention import RetentionPolicy
from dlrover_events.checkpoints.storage import StorageError, remove
from dlrover_events.checkpoints.store import Batch, CheckpointStore, Pending
from dlrover_events.cli.params import env_name
from dlrover_events.cli.runner import run_async
from dlrover_events.lifecycle import background, wait_for_any, wait_or_stop
from dlrover_events.runtime.restarts import restart_until_stopped
from dlrover_events.runtime.services import Service, ServiceContext
from dlrover_events.runtime.standalone import serve_alone
from dlrover_events.settings import Settings, load_settings, settings_error
from dlrover_events.store import create_pool, env_schema
from schemas.checkpoints import CheckpointDeleted, DeletionReason
from schemas.jobs import JobMeta

log = logging.getLogger(__name__)

GROUP = "checkpoints"
PREFIX = "DLROVER_EVENTS_CHECKPOINTS_"
FETCH_WAIT_MS = 200
#: deletions the deleter takes from the table at once
PAGE = 1000


class CheckpointsSettings(BaseSettings):
    """The checkpoints service's settings (DLROVER_EVENTS_CHECKPOINTS_*): Determined's
    retention policy, with its names and defaults, and how to reach the storage."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore")

    save_experiment_best: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="the best checkpoints of each experiment kept, over all its trials, by "
        "its searcher's metric (Determined's save_experiment_best)",
    )
    save_trial_best: int = Field(
        default=1,
        ge=0,
        le=1_000_000,
        description="the best checkpoints of each trial kept, by its experiment's metric "
        "(Determined's save_trial_best; a job outside an experiment has no metric)",
    )
    save_trial_latest: int = Field(
        default=1,
        ge=0,
        le=1_000_000,
        description="the latest checkpoints of each job kept (Determined's "
        "save_trial_latest); the newest of a job is kept whatever this says",
    )
    storage_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description='fsspec storage options by protocol, as JSON (e.g. {"s3": '
        '{"endpoint_url": "http://minio:9000"}}): how the service reaches the checkpoints '
        "it deletes",
    )
    retry_s: float = Field(
        default=30.0,
        gt=0,
        le=86_400,
        description="seconds between tries to delete checkpoints whose storage failed",
    )

    @property
    def policy(self) -> RetentionPolicy:
        return RetentionPolicy(
            save_experiment_best=self.save_experiment_best,
            save_trial_best=self.save_trial_best,
            save_trial_latest=self.save_trial_latest,
        )


def load_checkpoints_settings(**given: Any) -> CheckpointsSettings:
    """DLROVER_EVENTS_CHECKPOINTS_* under ``given``; a bad value is one line."""
    try:
        return CheckpointsSettings(**given)
    except ValidationError as err:
        raise settings_error(err, PREFIX) from None


class Tally:
    """What the service did since it started (the tests read it)."""

    def __init__(self) -> None:
        self.batches = 0
        self.committed = 0
        self.deleted = 0
        self.removed = 0
        self.storage_failures = 0


def deleted_event(env: str, pending: Pending) -> CheckpointDeleted:
    return CheckpointDeleted(
        env=env,
        source="checkpoints",
        job=JobMeta(uuid=pending.job_uuid, name=pending.job_name),
        checkpoint_id=pending.checkpoint_id,
        url=pending.url,
        step=pending.step,
        experiment=pending.experiment,
        trial=pending.trial,
        reason=DeletionReason(pending.reason),
        detail=pending.detail[:1024],
    )


class Deleter:
    """Removes the files of the checkpoints retention chose, says so, marks them."""

    def __init__(
        self,
        env: str,
        store: CheckpointStore,
        producer: Producer,
        own: CheckpointsSettings,
        tally: Tally,
    ) -> None:
        self.env = env
        self.store = store
        self.producer = producer
        self.own = own
        self.tally = tally
        self.wake = asyncio.Event()

    async def drain(self) -> int:
        """Every pending deletion tried once (a page of them: a full page wakes the
        deleter again); returns how many failed."""
        failed = 0
        page = await self.store.pending(PAGE)
        if len(page) == PAGE:
            self.wake.set()
        for pending in page:
            try:
                if await remove(pending.url, self.own.storage_options):
                    self.tally.removed += 1
            except StorageError as err:
                failed += 1
                self.tally.storage_failures += 1
                log.warning(
                    "env %s: cannot delete checkpoint %s yet (%s); trying again in %.0f s",
                    self.env,
                    pending.checkpoint_id,
                    err,
                    self.own.retry_s,
                )
                continue
            await self.producer.publish(deleted_event(self.env, pending))
            await self.store.mark_deleted(pending.checkpoint_id, datetime.now(UTC))
            self.tally.deleted += 1
            log.info(
                "env %s: deleted checkpoint %s (%s): %s",
                self.env,
                pending.checkpoint_id,
                pending.url,
                pending.detail,
            )
        return failed

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.wake.clear()
            failed = await self.drain()
            if failed:
                await wait_or_stop(stop, self.own.retry_s)
            else:
                await wait_for_any([stop, self.wake])


def checkpoints_consumer(
    settings: Settings,
    env: str,
    store: CheckpointStore,
    own: CheckpointsSettings,
    tally: Tally,
    wake: asyncio.Event,
) -> Consumer:
    """The consumer whose handler records each batch and decides retention for what it
    touched, before the batch's offsets are committed."""

    async def handle(received: list[Received]) -> None:
        batch = Batch()
        for item in received:
            batch.add(item.event)
        recorded = await store.record(batch)
        tally.batches += 1
        tally.committed += recorded.committed
        if recorded.jobs:
            decision = await store.apply_retention(own.policy, recorded.jobs, recorded.experiments)
            if decision.delete:
                wake.set()

    return Consumer(settings, env, (CHECKPOINTS,), GROUP, handle, fetch_max_wait_ms=FETCH_WAIT_MS)


async def serve(
    ctx: ServiceContext,
    store: CheckpointStore,
    own: CheckpointsSettings,
    tally: Tally,
    healthy: asyncio.Event,
) -> None:
    """Consume, record, decide and delete until told to stop."""
    async with Producer(ctx.settings) as producer:
        deleter = Deleter(ctx.env, store, producer, own, tally)
        consumer = checkpoints_consumer(ctx.settings, ctx.env, store, own, tally, deleter.wake)
        async with consumer, background(deleter.run(ctx.stop), name="deleter") as beside:
            ctx.ready.set()
            healthy.set()
            while not ctx.stop.is_set():
                await consumer.poll(timeout_ms=500)
                if any(t.done() for t in beside):
                    beside.raise_failure()
                    return


async def run(
    ctx: ServiceContext, own: CheckpointsSettings | None = None, tally: Tally | None = None
) -> None:
    """The checkpoints service of ``ctx.env`` until ``ctx.stop``."""
    own = own if own is not None else load_checkpoints_settings()
    tally = tally if tally is not None else Tally()
    pool = await create_pool(ctx.pg_dsn, env_schema(ctx.env), max_size=3)
    store = CheckpointStore(pool)
    try:
        await restart_until_stopped(
            ctx.stop,
            lambda healthy: serve(ctx, store, own, tally, healthy),
            what=f"checkpoints service of env {ctx.env}",
        )
    finally:
        await pool.close()


async def _serve(ctx: ServiceContext) -> None:
    await run(ctx)


service = Service(
    name="checkpoints",
    description="records the env's checkpoints in its Postgres (checkpoint list, "
    "/v1/checkpoints) and deletes those its retention policy no longer keeps",
    run=_serve,
)


def checkpoints_command(
    env: str = typer.Option(
        ..., "--env", "-e", parser=env_name, help="the env whose checkpoints to keep"
    ),
) -> None:
    """Run the checkpoints service of one env alone: its checkpoints recorded, those its
    retention policy no longer keeps deleted."""
    load_checkpoints_settings()  # a bad setting is one line before anything starts

    def say(ctx: ServiceContext) -> None:
        typer.echo(
            f"checkpoints service of env {env} is running (metrics: "
            f"{ctx.endpoints['metrics']}, /healthz and /readyz beside them); Ctrl-C stops it",
            err=True,
        )

    run_async(serve_alone(load_settings(), check_env_name(env), service.name, _serve, on_ready=say))


__all__ = [
    "GROUP",
    "CheckpointsSettings",
    "Deleter",
    "Tally",
    "checkpoints_command",
    "checkpoints_consumer",
    "load_checkpoints_settings",
    "run",
    "service",
]
