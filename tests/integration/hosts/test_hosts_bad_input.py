"""Bad input around plain hosts: an agent with wrong credentials, a host name taken, a pod
asking for more slots than any host has, and garbage on the reports topic. Each is a
clear one-line error or a dead letter, and nothing else is disturbed."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topic_reader import read_topic
from dlrover_events.bus.topics import DLQ, HOSTS_REPORTS, topic
from dlrover_events.errors import UserError
from dlrover_events.runtime.embedded import Broker
from dlrover_events.settings import Settings
from handlers.operator.hosts.cluster import HostsCluster
from handlers.operator.platform.bodies import NewPod, Resources
from schemas.codec import decode
from schemas.dlq import DeadLetter
from schemas.hosts import HostReported
from tests.conftest import ARTIFACTS, EnvFactory, cli_environ
from tests.contract.platform import PlatformConformance, until
from tests.integration.hosts.conftest import agent_in, agents

CLI = str(Path(sys.executable).parent / "dlrover-events")


async def test_an_agent_with_wrong_credentials_says_so_in_one_line(
    settings: Settings, pg_dsn: str, tmp_path: Path
) -> None:
    """tansu with SASL on refuses every login: what a real broker answers to a wrong
    password."""
    broker = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs", authentication=True)
    await broker.start_async()
    try:
        env = {
            **cli_environ(settings, pg_dsn),
            "DLROVER_EVENTS_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
            "DLROVER_EVENTS_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "DLROVER_EVENTS_SASL_MECHANISM": "SCRAM-SHA-512",
            "DLROVER_EVENTS_SASL_USERNAME": "agent",
            "DLROVER_EVENTS_SASL_PASSWORD": "not-the-password",
        }
        done = await asyncio.to_thread(
            subprocess.run,
            [CLI, "agent", "--env", "prod", "--host", "h1", "--workdir", str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        broker.stop()
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("error: Kafka at "), done.stderr
    assert "wrong username or password" in lines[-1]
    assert "Traceback" not in done.stderr


async def test_a_taken_host_name_is_refused(
    settings: Settings, make_env: EnvFactory, tmp_path: Path
) -> None:
    env = (await make_env(partitions=1)).name
    async with agents(settings, env, tmp_path / "a", {"twin": 1}) as running:
        second = agent_in(settings, env, tmp_path / "b", "twin", 1)
        with pytest.raises(UserError, match="host name 'twin' is taken"):
            await second.agent.run(asyncio.Event())
        assert running["twin"].task is not None and not running["twin"].task.done()


async def test_garbage_reports_are_dead_letters_and_a_pod_too_big_waits(
    settings: Settings,
    make_env: EnvFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = (await make_env(partitions=1)).name
    async with agents(settings, env, tmp_path / "agents", {"h1": 2}):
        platform = HostsCluster(
            tmp_path / "hosts", settings=settings, env=env, runs_pods=True, poll_s=0.05
        )
        await platform.start()
        try:
            async with Producer(settings) as producer:
                reports = topic(env, HOSTS_REPORTS)
                await producer.send_raw(reports, b"{not json", b"h9")
                wrong_key = HostReported(env=env, host="h8", agent_id="x", address="10.0.0.8")
                await producer.send_raw(reports, wrong_key.model_dump_json().encode(), b"h7")
            letters = await until(
                "two dead letters of the reports",
                lambda: _letters(settings, env),
            )
            assert {letter.original_topic for letter in letters} == {reports}
            assert any("keyed" in letter.error for letter in letters), letters
            assert set(platform.hosts) == {"h1"}, "a garbage report made a host"

            suite = PlatformConformance()
            with caplog.at_level(logging.ERROR, logger="handlers.operator.hosts.cluster"):
                job = await suite.submit(platform, replicas=1)
                huge = NewPod("worker", 0, 0, Resources(gpu=8))
                assert await platform.create_pod(job, huge, "t")
                small = await suite.submit(platform, replicas=1)
                await platform.create_pod(small, NewPod("worker", 0, 0, Resources()), "t")

                async def small_runs() -> bool:
                    pods, _ = await platform.list_pods(small.name)
                    return any(p.running for p in pods)

                await until("the small job's pod running", small_runs)
            pods, _ = await platform.list_pods(job.name)
            assert [p.phase for p in pods] == ["Pending"]
            assert "asks for 8 slots, more than any live host has (at most 2)" in caplog.text
        finally:
            await platform.stop(end_pods=True)


async def _letters(settings: Settings, env: str) -> list[DeadLetter] | None:
    records = await read_topic(settings, topic(env, DLQ), timeout_s=5)
    letters = [e for e in (decode(r.value) for r in records) if isinstance(e, DeadLetter)]
    return letters if len(letters) >= 2 else None
