"""Run the archiver's consumer for one batch, make its effect durable, then die before the
commit, as a `kill -9` between effect and commit would. Used by test_commit_after_effect.
"""

from __future__ import annotations

import asyncio
import os
import sys

from dlrover_events.bus.consumer import Received
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from streams.archiver import archiver_consumer


async def main(bootstrap: str, dsn: str, env: str, expect: int) -> None:
    settings = Settings(
        bootstrap_servers=bootstrap, pg_dsn=dsn, session_timeout_ms=2000, heartbeat_interval_ms=300
    )
    store = await EnvStore.open(dsn, env, max_size=1)
    seen = 0
    real_archive = store.archive

    async def archive_then_die(items: list[Received]) -> int:  # type: ignore[override]
        nonlocal seen
        n = await real_archive(items)
        seen += len(items)
        if seen >= expect:
            print(f"archived {seen}, dying before commit", flush=True)
            os._exit(17)
        return n

    store.archive = archive_then_die  # type: ignore[method-assign]
    consumer = archiver_consumer(settings, env, store)
    await consumer.start()
    while True:
        await consumer.poll(timeout_ms=500)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
