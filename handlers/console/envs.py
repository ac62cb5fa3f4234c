"""The envs one console shows, each on demand: its tokens (the env's own gateway_tokens,
as every API of the env checks them) and, once a page of that env was let in, a hub that
follows its topics.

A console is started for a home env (`console --env E`, the env `up` runs) and follows it
from the start; any other env of the registry is followed from the first page that shows
it. At most ``max_envs`` envs are followed at once: the one no page has asked for longest,
with no page open on it, is let go (its hub stopped, its memory freed); when every one has
a page open, a new env is refused (503) rather than memory grown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

import asyncpg

from dlrover_events.envs.registry import EnvRecord, EnvRegistry
from dlrover_events.envs.tokens import Tokens
from dlrover_events.lifecycle import AsyncResource, wait_for_any
from dlrover_events.settings import Settings
from dlrover_events.store import create_pool, env_schema, prepare_env
from handlers.console.board import Board
from handlers.console.hub import Hub

log = logging.getLogger(__name__)

#: How long the registry's list of envs is reused before it is read again.
REGISTRY_TTL_S = 2.0


class NoSuchEnv(LookupError):
    """The registry has no env of that name (or it is being deleted)."""


class TooManyEnvs(RuntimeError):
    """Every env the console may follow at once has a page open on it."""


@dataclass(frozen=True)
class BoardSizes:
    """What one env's board keeps (the console's settings)."""

    backlog: int = 500
    queue: int = 1000
    max_jobs: int = 2000
    timeline: int = 50
    points: int = 240
    letters: int = 200


@dataclass(eq=False)
class EnvView:
    env: str
    pool: asyncpg.Pool
    tokens: Tokens
    hub: Hub | None = None
    task: asyncio.Task[None] | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    used: float = field(default_factory=time.monotonic)

    @property
    def subscribers(self) -> int:
        return self.hub.subscribers if self.hub is not None else 0

    async def close(self) -> None:
        self.stop.set()
        if self.hub is not None:
            self.hub.close()
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
            self.task = None
        await self.pool.close()


class EnvViews(AsyncResource):
    def __init__(
        self,
        settings: Settings,
        dsn: str,
        home: str,
        *,
        sizes: BoardSizes | None = None,
        max_envs: int = 4,
        token_cache_s: float = 5.0,
    ) -> None:
        self.settings = settings
        self.dsn = dsn
        self.home = home
        self.sizes = sizes or BoardSizes()
        self.max_envs = max(max_envs, 1)
        self.token_cache_s = token_cache_s
        self.registry = EnvRegistry(settings, dsn)
        self._views: dict[str, EnvView] = {}
        self._lock = asyncio.Lock()
        self._listed: tuple[float, list[EnvRecord]] | None = None

    async def start(self) -> None:
        await prepare_env(self.dsn, self.home)
        await self.hub(self.home)

    async def stop(self) -> None:
        views, self._views = list(self._views.values()), {}
        for view in views:
            await view.close()

    @property
    def subscribers(self) -> int:
        return sum(v.subscribers for v in self._views.values())

    def close_feeds(self) -> None:
        """End every page's feed now, so a stopping server does not wait for idle pages."""
        for view in self._views.values():
            if view.hub is not None:
                view.hub.close()

    def home_hub(self) -> Hub:
        hub = self._views[self.home].hub
        assert hub is not None
        return hub

    async def wait_ready(self, timeout_s: float) -> None:
        """Until the home env's hub follows every topic of the env."""
        view = self._views[self.home]
        assert view.hub is not None
        assert view.task is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await wait_for_any([view.hub.ready], [view.task])
        if view.task.done():
            view.task.result()  # the hub died: say why
        if not view.hub.ready.is_set():
            raise TimeoutError(f"the console of env {self.home} did not follow its topics")

    async def envs(self, *, fresh: bool = False) -> list[EnvRecord]:
        """The registry's envs, read at most every REGISTRY_TTL_S."""
        now = time.monotonic()
        if fresh or self._listed is None or now - self._listed[0] > REGISTRY_TTL_S:
            self._listed = (now, await self.registry.list())
        return self._listed[1]

    async def record(self, env: str) -> EnvRecord:
        found = {e.name: e for e in await self.envs()}
        if env not in found:
            found = {e.name: e for e in await self.envs(fresh=True)}
        if env not in found:
            raise NoSuchEnv(f"no env named {env!r} (see `dlrover-events env list`)")
        return found[env]

    async def tokens(self, env: str) -> Tokens:
        """The env's tokens; opens the env's view (not yet its hub)."""
        return (await self._view(env)).tokens

    async def pool(self, env: str) -> asyncpg.Pool:
        """The env's Postgres (its schema), for what the console reads there."""
        return (await self._view(env)).pool

    async def hub(self, env: str) -> Hub:
        """The env's hub, started on first use (the caller was let in)."""
        view = await self._view(env)
        if view.hub is None:
            sizes = self.sizes
            board = Board(
                max_jobs=sizes.max_jobs,
                timeline=sizes.timeline,
                points=sizes.points,
                max_letters=sizes.letters,
            )
            view.hub = Hub(
                self.settings, env, backlog_size=sizes.backlog, queue_size=sizes.queue, board=board
            )
            view.task = asyncio.create_task(view.hub.run(view.stop), name=f"console-hub-{env}")
            log.info("console follows env %s", env)
        return view.hub

    async def forget(self, env: str) -> None:
        """Stop following an env (it was deleted); the home env is kept."""
        if env != self.home and (view := self._views.pop(env, None)) is not None:
            await view.close()

    async def _view(self, env: str) -> EnvView:
        view = self._views.get(env)
        if view is None:
            async with self._lock:
                view = self._views.get(env)
                if view is None:
                    view = await self._open(env)
        view.used = time.monotonic()
        return view

    async def _open(self, env: str) -> EnvView:
        if env != self.home:
            await self.record(env)
            await self._make_room()
        pool = await create_pool(self.dsn, env_schema(env), min_size=0, max_size=2)
        view = EnvView(env, pool, Tokens(pool, env, ttl_s=self.token_cache_s))
        self._views[env] = view
        return view

    async def _make_room(self) -> None:
        while len(self._views) >= self.max_envs:
            idle = [v for v in self._views.values() if v.env != self.home and not v.subscribers]
            if not idle:
                raise TooManyEnvs(
                    f"the console follows {len(self._views)} envs, each with a page open "
                    f"(DLROVER_EVENTS_CONSOLE_MAX_ENVS={self.max_envs}); close one first"
                )
            oldest = min(idle, key=lambda v: v.used)
            del self._views[oldest.env]
            log.info("console lets env %s go (no page open on it)", oldest.env)
            await oldest.close()


__all__ = ["BoardSizes", "EnvView", "EnvViews", "NoSuchEnv", "TooManyEnvs"]
