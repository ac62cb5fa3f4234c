"""A real console per test: a fresh env on the session's broker and Postgres, port 0."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from dlrover_events.bus.producer import Producer
from dlrover_events.envs.tokens import Scope
from dlrover_events.settings import Settings
from handlers.console.runtime import ConsoleServer, ConsoleSettings
from tests.conftest import EnvFactory
from tests.integration.gateway.conftest import mint


@dataclass
class Console:
    server: ConsoleServer
    env: str
    url: str
    token: str
    producer: Producer

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture
async def console(settings: Settings, pg_dsn: str, make_env: EnvFactory) -> AsyncIterator[Console]:
    env = (await make_env(partitions=2)).name
    token = await mint(pg_dsn, env, Scope.READ)
    conf = ConsoleSettings(host="127.0.0.1", port=0, token_cache_s=0.5)
    async with ConsoleServer(settings, env, pg_dsn, conf) as server, Producer(settings) as prod:
        await server.wait_ready(30)
        yield Console(server, env, server.url, token, prod)
