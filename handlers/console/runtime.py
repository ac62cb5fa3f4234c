"""Starting and stopping one console: token pool, hub, HTTP site. Shared by the command,
the `up` service and the tests, so they all run the same thing."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
from aiohttp import web
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from dlrover_events.envs.tokens import Tokens
from dlrover_events.lifecycle import AsyncResource, wait_for_any
from dlrover_events.settings import Settings
from dlrover_events.store import create_pool, env_schema, prepare_env
from handlers.console.app import build_app
from handlers.console.hub import Hub


class ConsoleSettings(BaseSettings):
    """The console's own knobs (DLROVER_EVENTS_CONSOLE_*)."""

    model_config = SettingsConfigDict(env_prefix="DLROVER_EVENTS_CONSOLE_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="listen address; loopback by default")
    port: int = Field(default=8480, ge=0, le=65535, description="0: any free port")
    token_cache_s: float = Field(
        default=5.0, gt=0, description="how long a token's verdict is kept"
    )
    backlog: int = Field(default=500, ge=0, description="recent events a new page may ask for")
    queue: int = Field(default=1000, ge=1, description="events a slow page may lag behind")


class ConsoleServer(AsyncResource):
    def __init__(
        self, settings: Settings, env: str, dsn: str, conf: ConsoleSettings | None = None
    ) -> None:
        self.settings = settings
        self.env = env
        self.dsn = dsn
        self.conf = conf or ConsoleSettings()
        self.hub = Hub(settings, env, backlog_size=self.conf.backlog, queue_size=self.conf.queue)
        self.port = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self._pool: asyncpg.Pool | None = None

    @property
    def url(self) -> str:
        host = self.conf.host if self.conf.host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port}/"

    async def start(self) -> None:
        await prepare_env(self.dsn, self.env)
        try:
            self._pool = await create_pool(self.dsn, env_schema(self.env), max_size=2)
            tokens = Tokens(self._pool, self.env, ttl_s=self.conf.token_cache_s)
            self._task = asyncio.create_task(self.hub.run(self._stop), name="console-hub")
            self._runner = web.AppRunner(build_app(self.env, self.hub, tokens), access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.conf.host, self.conf.port)
            await site.start()
            sockets = site._server.sockets if site._server is not None else []  # type: ignore[attr-defined]
            self.port = sockets[0].getsockname()[1] if sockets else self.conf.port
        except BaseException:
            await self.stop()
            raise

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until the hub follows every topic of the env (it may still be replaying)."""
        assert self._task is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await wait_for_any([self.hub.ready], [self._task])
        if self._task.done():
            self._task.result()  # the hub died: say why
        if not self.hub.ready.is_set():
            raise TimeoutError(f"the console of env {self.env} did not follow its topics")

    async def stop(self) -> None:
        self._stop.set()
        self.hub.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
