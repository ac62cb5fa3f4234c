"""A command's service, run alone: fenced to its env and its metrics served."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from dlrover_events.envs import EnvRegistry
from dlrover_events.metrics import EvaluatorMetrics
from dlrover_events.services import ServiceContext
from dlrover_events.settings import Settings
from dlrover_events.standalone import standalone
from tests.conftest import EnvFactory

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
            async with standalone(ctx, signals=False):
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
