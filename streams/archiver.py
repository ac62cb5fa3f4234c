"""The event archive: every valid event of an env, once, in the env's Postgres.

It is the simplest stream processor there is and shows the delivery rule every other one
follows: the batch is written (idempotently, by event_id) before its offsets are committed.
"""

from __future__ import annotations

import logging

from dlrover_events.bus import Consumer, Received
from dlrover_events.services import Service, ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from dlrover_events.topics import ENV_TOPIC_NAMES

log = logging.getLogger(__name__)

GROUP = "archiver"


def archiver_consumer(settings: Settings, env: str, store: EnvStore) -> Consumer:
    async def handle(batch: list[Received]) -> None:
        await store.archive(batch)

    return Consumer(settings, env, ENV_TOPIC_NAMES, GROUP, handle)


async def run(ctx: ServiceContext) -> None:
    store = await EnvStore.open(ctx.pg_dsn, ctx.env, max_size=2)
    try:
        async with archiver_consumer(ctx.settings, ctx.env, store) as consumer:
            ctx.ready.set()
            while not ctx.stop.is_set():
                await consumer.poll(timeout_ms=500)
    finally:
        await store.close()


service = Service(
    name="archiver",
    description="writes every valid event of the env to its events_archive table",
    run=run,
)
