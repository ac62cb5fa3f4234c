"""`dlrover-events up` as a user runs it: the stack comes up, serves, stops cleanly, and
watches what it started (its broker, its services, its env)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dlrover_events.bus.admin import TopicAdmin
from dlrover_events.bus.producer import Producer
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.runtime.embedded import Broker, free_port, port_open
from dlrover_events.runtime.metrics import catalogue
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from schemas import EnvMode, JobMeta, JobSubmitted
from tests.conftest import REPO, unique_env

pytestmark = pytest.mark.integration


class Up:
    """`dlrover-events up` in its own process; its output is collected as it comes."""

    def __init__(
        self,
        environ: dict[str, str],
        *args: str,
        command: list[str] | None = None,
        cwd: Path = REPO,
    ) -> None:
        """`command`: how `up` is started (default: this interpreter's, from the checkout)."""
        self.metrics_port = int(environ["DLROVER_EVENTS_METRICS_PORT"])
        here = [sys.executable, "-c", "from dlrover_events.cli.app import main; main()", "up"]
        self.proc = subprocess.Popen(
            [*(command or here), *args],
            cwd=cwd,
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._read, args=(stream, into), daemon=True).start()

    @staticmethod
    def _read(stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line)

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    async def wait_for(self, what: Callable[[], bool], why: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not what():
            assert time.monotonic() < deadline, f"{why} within {timeout_s}s; stderr:\n{self.stderr}"
            await asyncio.sleep(0.1)

    async def started(self) -> None:
        await self.wait_for(
            lambda: "Ctrl-C stops everything" in self.stdout or self.proc.poll() is not None,
            "up printed where it listens",
        )
        assert self.proc.poll() is None, self.stderr

    @property
    def broker_pid(self) -> int:
        found = re.search(r"tansu \(embedded, pid (\d+)\)", self.stdout)
        assert found, self.stdout
        return int(found.group(1))

    def get(self, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    async def status(self, path: str) -> int:
        return (await asyncio.to_thread(self.get, path))[0]

    async def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.to_thread(self.proc.wait, 30)


def up_environ(pg_dsn: str, data_dir: object, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DLROVER_EVENTS_BROKER_PORT": str(free_port()),
        "DLROVER_EVENTS_GATEWAY_PORT": str(free_port()),
        "DLROVER_EVENTS_CONSOLE_PORT": str(free_port()),
        "DLROVER_EVENTS_LOCAL_API_PORT": str(free_port()),
        "DLROVER_EVENTS_METRICS_PORT": str(free_port()),
        "DLROVER_EVENTS_PG_DSN": pg_dsn,
        "DLROVER_EVENTS_DATA_DIR": str(data_dir),
        "DLROVER_EVENTS_SESSION_TIMEOUT_MS": "2000",
        "DLROVER_EVENTS_HEARTBEAT_INTERVAL_MS": "300",
        "DLROVER_EVENTS_BUS_PROBE_S": "0.3",
        # the broker's records in memory: these tests start `up` afresh, each on its own
        # (test_up_history.py keeps them in Postgres)
        "DLROVER_EVENTS_BROKER_STORAGE": "memory",
        "COLUMNS": "200",
        **extra,
    }


async def test_up_runs_the_stack_and_stops_on_sigterm(own_pg: str, tmp_path: Path) -> None:
    # A database of its own: the real env `up` makes (`prod`) takes no other test's place.
    pg_dsn = own_pg
    environ = up_environ(pg_dsn, tmp_path)
    port = int(environ["DLROVER_EVENTS_BROKER_PORT"])
    up = Up(environ)
    try:
        await up.started()
        assert "dlrover-events is up" in up.stdout
        assert f"127.0.0.1:{port}" in up.stdout
        assert "watchdog" in up.stdout, "the watchdog is a service of up"
        assert re.search(r"service\W+local\W", up.stdout), "the local platform is a service"
        # and a newcomer's next step is named (README, the first five minutes)
        assert "run a job: dlrover-events job submit examples/elastic/job.yaml" in up.stdout
        where = re.escape(str(tmp_path))  # (absolute, as pytest gives it)
        assert re.search(rf"data dir\W+{where}", up.stdout), "up names its data dir, absolute"

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
        assert await up.status("/healthz") == 200
        await up.wait_for(lambda: up.get("/readyz")[0] == 200, "/readyz said ready")
        _, metrics = await asyncio.to_thread(up.get, "/metrics")
        for svc in ("archiver", "brain", "watchdog"):
            assert f'dlrover_events_service_up{{env="{real.name}",service="{svc}"}} 1.0' in metrics
        assert f'dlrover_events_bus_up{{env="{real.name}"}} 1.0' in metrics
        # every series of every service of `up` carries the env, and is in the catalogue
        known = {m.name.removesuffix("_total") for m in catalogue()}
        for family in text_string_to_metric_families(metrics):
            # the text format shows a counter's or histogram's `_created` as a family
            assert family.name.removesuffix("_created") in known, family.name
            for sample in family.samples:
                assert sample.labels.get("env") == real.name, sample
    finally:
        rc = await up.stop()
    assert rc == 0, up.stderr
    assert "stopped cleanly" in up.stderr
    # every service stopped within its grace, and closed its bus clients
    assert "did not stop within" not in up.stderr, up.stderr
    assert "Unclosed" not in up.stderr, up.stderr
    assert not port_open("127.0.0.1", port), "the broker stopped with the stack"


async def test_kill_9_of_up_takes_its_broker_along(own_pg: str, tmp_path: Path) -> None:
    environ = up_environ(own_pg, tmp_path)
    port = int(environ["DLROVER_EVENTS_BROKER_PORT"])
    up = Up(environ, "-s", "archiver")
    try:
        await up.started()
        broker = up.broker_pid
        up.proc.kill()
        await asyncio.to_thread(up.proc.wait, 30)
        await up.wait_for(
            lambda: not port_open("127.0.0.1", port) and not Path(f"/proc/{broker}").exists(),
            f"the broker (pid {broker}) died with `up` and freed port {port}",
            timeout_s=10,
        )
    finally:
        await up.stop()


async def test_a_killed_broker_is_said_restarted_and_every_env_gets_its_topics(
    settings: Settings, own_pg: str, tmp_path: Path
) -> None:
    # A virtual env with 2 partitions, registered before this `up`'s broker exists.
    virtual = unique_env("v")
    await EnvRegistry(settings, own_pg).create(virtual, EnvMode.VIRTUAL, partitions=2)
    up = Up(up_environ(own_pg, tmp_path), "-s", "archiver")
    try:
        await up.started()
        bus = Settings(bootstrap_servers=re.findall(r"127\.0\.0\.1:\d+", up.stdout)[0])

        async def partitions() -> dict[str, int]:
            async with TopicAdmin(bus) as admin:
                meta = await admin._client.describe_topics([f"{virtual}.job.metrics"])
            return {m["topic"]: len(m["partitions"]) for m in meta}

        assert await partitions() == {f"{virtual}.job.metrics": 2}, "re-created at start"
        broker = up.broker_pid
        os.kill(broker, signal.SIGKILL)
        await up.wait_for(
            lambda: f"broker tansu (pid {broker})" in up.stderr and "exited" in up.stderr,
            "up said its broker exited",
            timeout_s=10,
        )
        await up.wait_for(lambda: "started again" in up.stderr, "up restarted its broker")
        await up.wait_for(lambda: "re-created with their" in up.stderr, "and made the topics")
        assert await partitions() == {f"{virtual}.job.metrics": 2}, "re-created after restart"
        await up.wait_for(lambda: up.get("/readyz")[0] == 200, "ready again after the restart")
        assert up.proc.poll() is None
    finally:
        rc = await up.stop()
    assert rc == 0, up.stderr


async def test_readyz_says_not_ready_while_the_bus_is_away(own_pg: str, tmp_path: Path) -> None:
    port = free_port()
    external = Broker("127.0.0.1", port)
    external.start()
    environ = up_environ(own_pg, tmp_path, DLROVER_EVENTS_BOOTSTRAP_SERVERS=f"127.0.0.1:{port}")
    up = Up(environ, "-s", "archiver")
    try:
        await up.started()
        await up.wait_for(lambda: up.get("/readyz")[0] == 200, "/readyz said ready")
        external.kill()
        await up.wait_for(lambda: up.get("/readyz")[0] == 503, "/readyz said not ready")
        await up.wait_for(
            lambda: f"bus at 127.0.0.1:{port} does not answer" in up.stderr, "up said it"
        )
        assert await up.status("/healthz") == 200, "the process itself is fine"
        external = Broker("127.0.0.1", port)
        external.start()
        await up.wait_for(lambda: "answers again" in up.stderr, "up said the bus is back")
        await up.wait_for(lambda: up.get("/readyz")[0] == 200, "ready once the bus is back")
    finally:
        rc = await up.stop()
        external.stop()
    assert rc == 0, up.stderr


async def test_deleting_ups_env_stops_its_services_before_the_delete_returns(
    settings: Settings, own_pg: str, tmp_path: Path
) -> None:
    env = unique_env("u")
    environ = up_environ(
        own_pg,
        tmp_path,
        DLROVER_EVENTS_BOOTSTRAP_SERVERS=settings.bootstrap_servers,
        DLROVER_EVENTS_DEFAULT_ENV=env,
    )
    up = Up(environ, "-s", "archiver")
    try:
        await up.started()
        registry = EnvRegistry(settings.with_overrides(env_delete_timeout_s=60), own_pg)
        await registry.delete(env, force=True)
        # the delete returned once up's fence was released, i.e. its services had stopped
        await up.wait_for(lambda: up.proc.poll() is not None, "up exited", timeout_s=30)
        assert up.proc.returncode != 0
        assert f"env {env!r}" in up.stderr and "deleted" in up.stderr, up.stderr
        assert "Traceback" not in up.stderr
    finally:
        await up.stop()
