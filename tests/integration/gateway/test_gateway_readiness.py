"""The gateway is not ready while the bus is away (`up` clears the event it shares), and
its metrics go to the registry it was given (the service's, which `up` serves)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from dlrover_events.settings import Settings
from handlers.gateway.runtime import GatewayServer
from tests.conftest import EnvFactory
from tests.integration.gateway.conftest import gateway_settings

pytestmark = pytest.mark.integration


async def test_not_ready_while_the_bus_is_away(
    settings: Settings, pg_dsn: str, make_env: EnvFactory
) -> None:
    env = (await make_env(partitions=2)).name
    bus, registry = asyncio.Event(), CollectorRegistry()
    bus.set()
    server = GatewayServer(settings, env, pg_dsn, gateway_settings(), registry=registry, bus=bus)
    async with server, aiohttp.ClientSession() as http:
        await server.wait_ready(30)
        async with http.get(f"{server.url}/readyz") as resp:
            assert (resp.status, (await resp.json())["bus"]) == (200, True)
        bus.clear()  # the broker went away
        async with http.get(f"{server.url}/readyz") as resp:
            body = await resp.json()
            assert (resp.status, body["ready"], body["bus"]) == (503, False, False)
        bus.set()
        async with http.get(f"{server.url}/readyz") as resp:
            assert resp.status == 200
    assert f'dlrover_events_gateway_ready{{env="{env}"}} 1.0'.encode() in generate_latest(registry)
