"""A searcher that kills itself with SIGKILL once it has made a number of decisions, at a
chosen point of a batch: ``decided`` (its state, outbox and offsets committed to Postgres,
nothing published yet) or ``published`` (published and out of the outbox, the consumer's
offsets not yet committed). Used by test_searcher.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from dlrover_events.bus.consumer import Received
from dlrover_events.bus.producer import Producer
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from streams.searcher.runtime.processor import Outgoing, SearcherProcessor
from streams.searcher.runtime.service import SearcherSettings, searcher_consumer


class DyingSearcher(SearcherProcessor):
    def __init__(self, *args: Any, die_at: int, point: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.die_at = die_at
        self.point = point

    def _die(self, point: str) -> None:
        if self.point == point and self.decisions >= self.die_at:
            print(f"{self.decisions} decisions, dying at {point}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    async def _decide(self, batch: Sequence[Received]) -> list[Outgoing]:
        outgoing = await super()._decide(batch)
        self._die("decided")
        return outgoing

    async def handle(self, batch: list[Received]) -> None:
        await super().handle(batch)
        self._die("published")


async def main(bootstrap: str, dsn: str, env: str, die_at: int, point: str) -> None:
    settings = Settings(
        bootstrap_servers=bootstrap, pg_dsn=dsn, session_timeout_ms=2000, heartbeat_interval_ms=300
    )
    store = await EnvStore.open(dsn, env, max_size=3)
    async with Producer(settings) as producer:
        searcher = DyingSearcher(env, store.pool, producer, die_at=die_at, point=point)
        await searcher.flush_outbox()
        async with searcher_consumer(settings, env, searcher, SearcherSettings()) as consumer:
            print("consuming", flush=True)
            while True:
                await consumer.poll(timeout_ms=500)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]))
