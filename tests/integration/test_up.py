"""`dlrover-events up` as a user runs it: the stack comes up, serves, and stops cleanly."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from dlrover_events.bus import Producer
from dlrover_events.embedded import free_port, port_open
from dlrover_events.envs import EnvRegistry
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from schemas import JobMeta, JobSubmitted
from tests.conftest import REPO

pytestmark = pytest.mark.integration


async def test_up_runs_the_stack_and_stops_on_sigterm(pg_dsn: str, tmp_path: object) -> None:
    port = free_port()
    env = {
        **os.environ,
        "DLROVER_EVENTS_BROKER_PORT": str(port),
        "DLROVER_EVENTS_GATEWAY_PORT": str(free_port()),
        "DLROVER_EVENTS_CONSOLE_PORT": str(free_port()),
        "DLROVER_EVENTS_PG_DSN": pg_dsn,
        "DLROVER_EVENTS_DATA_DIR": str(tmp_path),
        "DLROVER_EVENTS_SESSION_TIMEOUT_MS": "2000",
        "DLROVER_EVENTS_HEARTBEAT_INTERVAL_MS": "300",
        "COLUMNS": "200",
    }
    proc = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-c", "from dlrover_events.cli import main; main()", "up"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out = ""
        deadline = time.monotonic() + 60
        while "Ctrl-C stops everything" not in out and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            line = await asyncio.to_thread(proc.stdout.readline)  # type: ignore[union-attr]
            out += line
        assert "dlrover-events is up" in out
        assert f"127.0.0.1:{port}" in out

        settings = Settings(bootstrap_servers=f"127.0.0.1:{port}", pg_dsn=pg_dsn)
        real = await EnvRegistry(settings, pg_dsn).real()
        assert real is not None
        event = JobSubmitted(env=real.name, job=JobMeta(uuid="job-up"))
        async with Producer(settings) as producer:
            await producer.publish(event)
        store = await EnvStore.open(pg_dsn, real.name)
        async with store:
            for _ in range(100):
                rows = await store.fetch(
                    "SELECT 1 FROM events_archive WHERE event_id = $1", event.event_id
                )
                if rows:
                    break
                await asyncio.sleep(0.1)
            assert rows, "the archiver service of `up` stored the event"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, timeout=30)
    assert proc.returncode == 0, err
    assert "stopped cleanly" in err
    assert not port_open("127.0.0.1", port), "the broker stopped with the stack"
