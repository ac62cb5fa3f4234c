"""A consumer killed after its effect but before its commit re-processes the same events,
and the effect is not duplicated (idempotent by event_id)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from streams.archiver import archiver_consumer
from tests.conftest import REPO, EnvFactory
from tests.integration.test_bus import sample

pytestmark = pytest.mark.integration


async def test_killed_before_commit_reprocesses_without_duplicating(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    events = [sample(env, f"job-{i % 4}", i) for i in range(50)]
    async with Producer(settings) as producer:
        await producer.publish_many(events)

    proc = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "tests.integration.crash_consumer",
            settings.bootstrap_servers,
            pg_dsn,
            env,
            str(len(events)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 17, proc.stdout + proc.stderr
    assert "dying before commit" in proc.stdout

    store = await EnvStore.open(pg_dsn, env)
    async with store:
        count = "SELECT count(*) AS n FROM events_archive"
        assert (await store.fetch(count))[0]["n"] == len(events)
        # Restart: nothing was committed, so the same group reads everything again...
        consumer = archiver_consumer(settings, env, store)
        async with consumer:
            for _ in range(40):
                await consumer.poll(timeout_ms=300)
                if consumer.processed >= len(events):
                    break
        assert consumer.processed == len(events)
        # ...and the archive still holds each event once.
        assert (await store.fetch(count))[0]["n"] == len(events)
        ids = await store.fetch("SELECT event_id FROM events_archive")
        assert {r["event_id"] for r in ids} == {e.event_id for e in events}
