"""A brain stuck retrying still stops on SIGTERM within seconds, having said why it retries."""

from __future__ import annotations

import asyncio
import signal
import sys

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from schemas.jobs import JobMeta, JobStarted
from tests.conftest import REPO, EnvFactory, cli_environ
from tests.integration.brain.workload import T0

pytestmark = pytest.mark.integration

SCRIPT = (
    "import logging, typer\n"
    "logging.basicConfig(level=logging.WARNING)\n"
    "from streams.brain.runtime.app import brain\n"
    "typer.run(brain)\n"
)


async def test_a_brain_stuck_loading_its_state_stops_on_sigterm(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env(partitions=1)).name
    # a state that does not load: the brain retries for as long as it stays so
    async with await EnvStore.open(pg_dsn, env) as store:
        await store.pool.execute(
            "INSERT INTO job_states (job_uuid, partition, state)"
            " VALUES ('bad', 0, '{\"status\": \"running\"}')"
        )
    # and something to decide, so that it loads its state
    async with Producer(settings) as producer:
        job = JobMeta(uuid="job-1")
        await producer.publish(JobStarted(env=env, job=job, occurred_at=T0))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SCRIPT,
        "--env",
        env,
        cwd=REPO,
        env=cli_environ(settings, pg_dsn),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        try:
            async with asyncio.timeout(60):
                while sum("loading the brain state" in line for line in lines) < 2:
                    raw = await proc.stdout.readline()
                    assert raw, "the brain exited early:\n" + "".join(lines)
                    lines.append(raw.decode())
        except TimeoutError:
            raise AssertionError("no retry said within 60 s:\n" + "".join(lines)) from None
        proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(15):
                rest, _ = await proc.communicate()
        except TimeoutError:
            raise AssertionError("the brain did not stop within 15 s of SIGTERM") from None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, "".join(lines) + rest.decode()
    retried = [line for line in lines if "loading the brain state" in line]
    # why, and when it tries again
    assert "ValidationError" in retried[0] and "retrying in" in retried[0], retried
