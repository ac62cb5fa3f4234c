"""A real gateway per test: fresh env (tansu + Postgres from tests/conftest.py), port 0."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest

from dlrover_events.envs.tokens import Scope, Tokens
from dlrover_events.settings import Settings
from dlrover_events.store import create_pool, env_schema
from handlers.gateway.runtime import GatewayServer, GatewaySettings, prepare_env
from tests.conftest import EnvFactory


@dataclass
class Running:
    server: GatewayServer
    env: str
    url: str
    admin: str
    read: str
    http: aiohttp.ClientSession

    def auth(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    @property
    def as_admin(self) -> dict[str, str]:
        return self.auth(self.admin)

    @property
    def as_reader(self) -> dict[str, str]:
        return self.auth(self.read)


async def mint(pg_dsn: str, env: str, *scopes: Scope) -> str:
    await prepare_env(pg_dsn, env)
    pool = await create_pool(pg_dsn, env_schema(env), max_size=1)
    try:
        _, token = await Tokens(pool, env).mint("test", scopes)
    finally:
        await pool.close()
    return token


def gateway_settings() -> GatewaySettings:
    return GatewaySettings(host="127.0.0.1", port=0, pool_max=3, token_cache_s=0.5)


@pytest.fixture
async def gw(settings: Settings, pg_dsn: str, make_env: EnvFactory) -> AsyncIterator[Running]:
    env = (await make_env(partitions=2)).name
    admin = await mint(pg_dsn, env, Scope.ADMIN)
    read = await mint(pg_dsn, env, Scope.READ)
    async with GatewayServer(settings, env, pg_dsn, gateway_settings()) as server:
        await server.wait_ready(30)
        async with aiohttp.ClientSession() as http:
            yield Running(server, env, server.url, admin, read, http)
