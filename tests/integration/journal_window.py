"""The window of the broker journal (docs/operations.md, What survives a restart of `up`):
acknowledged records lost by kill -9 of `up`. A producer with acks=all sends records into one
partition as fast as it can; `up` (journal on, its own database) is killed at a random
moment; a new `up` on the same database refills; the records the refilled partition lacks
among those acknowledged, and how long before the kill the oldest of them was acknowledged.

Run from the repository's root, with the machine's Postgres on 127.0.0.1:5432 (trust):
``.venv/bin/python -m tests.integration.journal_window [RUNS]``. A measurement, not a test:
its figures depend on the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import sys
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from dlrover_events.runtime.embedded import with_database
from tests.conftest import _admin
from tests.integration.test_up import Up, up_environ

PG = "postgresql://postgres@127.0.0.1:5432/postgres"
TOPIC = "w.job.events"


async def once(i: int, rng: random.Random) -> tuple[int, int, float]:
    """Acknowledged, lost, and seconds from the oldest lost one's ack to the kill."""
    db = f"dle_window_{os.getpid()}_{i}"
    await _admin(PG, f"CREATE DATABASE {db}")
    try:
        data = Path(f"/tmp/journal-window/{os.getpid()}-{i}")
        env = up_environ(with_database(PG, db), data, DLROVER_EVENTS_DEFAULT_ENV="w")
        del env["DLROVER_EVENTS_BROKER_STORAGE"]  # the default: the journal
        up = Up(env, "-s", "archiver")
        await up.started()
        servers = re.findall(r"127\.0\.0\.1:\d+", up.stdout)[0]
        producer = AIOKafkaProducer(
            bootstrap_servers=servers, acks="all", linger_ms=0, request_timeout_ms=3000
        )
        await producer.start()
        acked: list[tuple[int, float]] = []

        async def send() -> None:
            n = 0
            while True:
                md = await producer.send_and_wait(TOPIC, str(n).encode(), partition=0)
                acked.append((md.offset, time.monotonic()))
                n += 1

        sending = asyncio.create_task(send())
        await asyncio.sleep(rng.uniform(2.0, 4.0))
        up.proc.kill()
        killed = time.monotonic()
        await asyncio.to_thread(up.proc.wait)
        sending.cancel()
        with contextlib.suppress(BaseException):
            await sending
        with contextlib.suppress(BaseException):
            await producer.stop()
        again = Up(env, "-s", "archiver")
        await again.started()
        seen = await log_end(servers)
        await again.stop()
        lost = [t for o, t in acked if o >= seen]
        return len(acked), len(lost), (killed - min(lost)) if lost else 0.0
    finally:
        await _admin(PG, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


async def log_end(servers: str) -> int:
    """The partition's true end, read (tansu's ListOffsets answers a lower bound)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
    await consumer.start()
    tp = TopicPartition(TOPIC, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    end = 0
    while batch := await consumer.getmany(timeout_ms=1000):
        end = max(end, *(r.offset + 1 for rs in batch.values() for r in rs))
    await consumer.stop()
    return end


async def main(runs: int) -> None:
    rng = random.Random(37)
    for i in range(runs):
        n, lost, window = await once(i, rng)
        print(
            f"run {i}: acknowledged {n}, lost {lost}, the oldest lost acknowledged "
            f"{window:.3f}s before the kill",
            flush=True,
        )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
