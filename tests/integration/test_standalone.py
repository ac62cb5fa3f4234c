"""A command's service, run alone: fenced to its env, its metrics and probes served."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.runtime.embedded import Broker
from dlrover_events.runtime.metrics import EvaluatorMetrics
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.runtime.standalone import standalone
from dlrover_events.settings import Settings
from tests.conftest import ARTIFACTS, EnvFactory

pytestmark = pytest.mark.integration


async def test_serves_metrics_on_loopback_and_stops_when_its_env_is_deleted(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    # the configured port is taken (`up` holds it, say): the command serves elsewhere
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        conf = settings.model_copy(update={"metrics_port": port})
        ctx = ServiceContext(conf, env, pg_dsn)
        EvaluatorMetrics(ctx.metrics, env).records.inc(7)

        entered = asyncio.Event()

        async def service() -> None:
            async with standalone(ctx, "evaluator", signals=False):
                entered.set()
                await ctx.stop.wait()

        running = asyncio.create_task(service())
        async with asyncio.timeout(20):
            await entered.wait()
        url = ctx.endpoints["metrics"]
        assert url.startswith("http://127.0.0.1:") and f":{port}/" not in url
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            body = await resp.text()
        assert f'dlrover_events_evaluator_records_total{{env="{env}"}} 7.0' in body

        await EnvRegistry(settings, pg_dsn).delete(env)
        async with asyncio.timeout(20):
            await running  # the fence set ctx.stop: the service ended by itself
        assert ctx.stop.is_set()


async def _get(url: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.json()


async def _until(url: str, status: int, timeout_s: float = 20) -> dict[str, object]:
    async with asyncio.timeout(timeout_s):
        while True:
            got, body = await _get(url)
            if got == status:
                return body
            await asyncio.sleep(0.1)


async def test_probes_say_ready_only_while_the_service_and_its_bus_are(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env()).name
    # a broker of the test's own, so that it can go away under the command
    own = Broker("127.0.0.1", log_dir=ARTIFACTS / "logs")
    own.start()
    try:
        conf = settings.model_copy(
            update={
                "bootstrap_servers": own.bootstrap_servers,
                "metrics_port": 0,
                "bus_probe_s": 0.2,
            }
        )
        ctx = ServiceContext(conf, env, pg_dsn)
        entered = asyncio.Event()

        async def service() -> None:
            async with standalone(ctx, "archiver", signals=False):
                entered.set()
                await ctx.stop.wait()

        running = asyncio.create_task(service())
        async with asyncio.timeout(20):
            await entered.wait()
        base = ctx.endpoints["metrics"].removesuffix("/metrics")
        assert (await _get(f"{base}/healthz"))[0] == 200
        # started, not ready yet: the service has not said so
        status, body = await _get(f"{base}/readyz")
        assert (status, body["reason"]) == (503, "service archiver is starting")
        assert body["postgres"] is True and body["bus"] is True

        ctx.ready.set()
        await _until(f"{base}/readyz", 200)

        own.stop()
        body = await _until(f"{base}/readyz", 503)
        assert body["reason"] == f"bus at {own.bootstrap_servers} does not answer"
        assert not ctx.bus.is_set(), "the service sees the bus away too (ctx.bus)"
        assert (await _get(f"{base}/healthz"))[0] == 200, "the process itself is fine"

        own = Broker("127.0.0.1", own.port, ARTIFACTS / "logs")
        own.start()
        await _until(f"{base}/readyz", 200)

        ctx.stop.set()
        async with asyncio.timeout(20):
            await running
    finally:
        own.stop()
