"""Starting and stopping one gateway instance: pool, producer, feed follower, HTTP site.

Shared by the `up` service, the `gateway` command, the benchmark and the tests, so they
all run the same thing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg
from aiohttp import web
from aiokafka import ConsumerRecord
from prometheus_client import CollectorRegistry
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from dlrover_events.bus.compacted import CompactedFollower
from dlrover_events.bus.producer import Producer
from dlrover_events.bus.topics import BRAIN_PLANS, JOB_EVENTS, SCALE_PLANS, SCALE_RESULTS, topic
from dlrover_events.config.feed import ConfigFeed
from dlrover_events.envs.tokens import Scope, Tokens, hash_token
from dlrover_events.lifecycle import AsyncResource, background
from dlrover_events.runtime.supervisor import STOP_GRACE_S
from dlrover_events.settings import Settings
from dlrover_events.store import create_pool, env_schema, prepare_env
from handlers.gateway.app import (
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    MAX_CONFIG_WAITERS,
    Gateway,
    Limits,
    build_app,
)
from handlers.gateway.plan_state import MAX_JOBS, MAX_WAITERS, PlanBook
from handlers.gateway.plans import read_record
from handlers.gateway.state import GatewayState
from handlers.gateway.store import ConfigStore
from schemas.jobs import JobEvent

if TYPE_CHECKING:
    from handlers.gateway.configmaps_runner import ConfigMapWatcher

log = logging.getLogger(__name__)

#: How long in-flight requests may take once the gateway stops (waiting ones are answered
#: at once), well within the grace `up` gives a stopping service.
SHUTDOWN_S = STOP_GRACE_S / 4

#: What a job's plan view is folded from, each read whole from the beginning.
PLAN_TOPICS = (JOB_EVENTS, BRAIN_PLANS, SCALE_PLANS, SCALE_RESULTS)


class GatewaySettings(BaseSettings):
    """The gateway's own knobs (DLROVER_EVENTS_GATEWAY_*), beside the shared Settings."""

    model_config = SettingsConfigDict(env_prefix="DLROVER_EVENTS_GATEWAY_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="listen address; loopback by default")
    port: int = Field(default=8470, ge=0, le=65535, description="0: any free port")
    pool_max: int = Field(default=5, ge=1, description="Postgres connections of the gateway")
    token_cache_s: float = Field(default=5.0, gt=0, description="how long a verdict is kept")
    configmaps: bool = Field(
        default=False,
        description="sync ConfigMaps labelled dlrover-events.io/config=true into the env's"
        " documents; needs cluster credentials, so off by default",
    )
    namespace: str | None = Field(
        default=None, description="ConfigMaps' namespace; unset: the context's, the pod's"
    )
    kubeconfig: Path | None = Field(
        default=None, description="unset: $KUBECONFIG, ~/.kube/config, else in-cluster"
    )
    context: str | None = Field(default=None, description="kubeconfig context")
    configmap_key: str = Field(default="document.yaml", description="data key of the document")
    watch_timeout_s: int = Field(default=60, ge=1, description="server-side watch timeout")
    plan_jobs: int = Field(
        default=MAX_JOBS, ge=1, description="jobs whose plan is kept; finished ones go first"
    )
    plan_waiters: int = Field(
        default=MAX_WAITERS, ge=0, description="plan long-polls and optimize requests waiting"
    )
    plan_poll_ms: int = Field(
        default=100, ge=10, le=5000, description="longest fetch wait on the plan topics"
    )
    header_timeout_s: float = Field(
        default=HEADER_TIMEOUT_S,
        gt=0,
        le=3600,
        description="a connection is closed when it has not sent a request's headers this"
        " long after it opened or after its last answer (slow or idle clients)",
    )
    body_timeout_s: float = Field(
        default=BODY_TIMEOUT_S, gt=0, le=3600, description="a body slower than this is a 408"
    )
    config_waiters: int = Field(
        default=MAX_CONFIG_WAITERS,
        ge=0,
        description="/v1/config long-polls waiting at once; past it a 503 with Retry-After",
    )


class GatewayServer(AsyncResource):
    def __init__(
        self,
        settings: Settings,
        env: str,
        dsn: str,
        gateway_settings: GatewaySettings | None = None,
        *,
        registry: CollectorRegistry | None = None,
        bus: asyncio.Event | None = None,
    ) -> None:
        self.settings = settings
        #: where its metrics go: the service's registry under `up` or a command
        self.registry = registry if registry is not None else CollectorRegistry()
        self.bus = bus
        self.env = env
        self.dsn = dsn
        self.conf = gateway_settings or GatewaySettings()
        self.state = GatewayState(env)
        self.plans = PlanBook(env, max_jobs=self.conf.plan_jobs, max_waiters=self.conf.plan_waiters)
        self.port = 0
        self._stop = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._producer: Producer | None = None
        self._follower: ConfigFeed | None = None
        self._plan_feeds: list[CompactedFollower] = []
        self._pool: asyncpg.Pool | None = None
        self._exits = contextlib.AsyncExitStack()
        self.gateway: Gateway | None = None
        #: the ConfigMap watch, when ``configmaps`` is on
        self.configmaps: ConfigMapWatcher | None = None
        self._kube: Any = None

    @property
    def url(self) -> str:
        host = self.conf.host if self.conf.host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        await prepare_env(self.dsn, self.env)
        # each part's stop is pushed as the part starts: `stop` ends them in reverse, all
        # of them, even when one fails or the stop is cancelled midway (a supervisor's
        # grace ran out), so no consumer, producer or connection is left open
        exits = self._exits = contextlib.AsyncExitStack()
        try:
            pool = self._pool = await create_pool(
                self.dsn, env_schema(self.env), max_size=self.conf.pool_max
            )
            exits.push_async_callback(pool.close)
            producer = self._producer = Producer(self.settings, linger_ms=0)
            await producer.start()
            exits.push_async_callback(producer.stop)
            follower = self._follower = ConfigFeed(
                self.settings,
                self.env,
                self.state.apply,
                client_id="gateway",
                caught_up=self.state.ready,
            )
            await follower.start()
            exits.push_async_callback(follower.stop)
            await self._start_plan_feeds(exits)
            tokens = Tokens(pool, self.env, ttl_s=self.conf.token_cache_s)
            if self.settings.admin_token is not None:
                await self._bootstrap_admin(tokens, self.settings.admin_token.get_secret_value())
            store = ConfigStore(pool, self.env, producer)
            self.gateway = Gateway(
                self.env,
                self.state,
                store,
                tokens,
                self.registry,
                self.plans,
                producer.publish,
                Limits(
                    header_timeout_s=self.conf.header_timeout_s,
                    body_timeout_s=self.conf.body_timeout_s,
                    config_waiters=self.conf.config_waiters,
                ),
                bus=self.bus,
            )
            tasks = await exits.enter_async_context(background())
            tasks.start(self._follow(), name="gateway-follow")
            for feed in self._plan_feeds:
                tasks.start(feed.run(self._stop), name=f"gateway-{feed.topic}")
            tasks.start(self._plans_caught_up(), name="gateway-plans")
            tasks.start(self._reconcile(store), name="gateway-sync")
            if self.conf.configmaps:
                await self._start_configmaps(store, exits)
            # in-flight requests get a part of the supervisor's grace (long-polls and
            # optimize requests are answered at once: `build_app`'s shutdown hook)
            runner = self._runner = web.AppRunner(
                build_app(self.gateway), access_log=None, shutdown_timeout=SHUTDOWN_S
            )
            await runner.setup()
            exits.push_async_callback(runner.cleanup)
            site = web.TCPSite(runner, self.conf.host, self.conf.port, backlog=1024)
            await site.start()
            sockets = site._server.sockets if site._server is not None else []  # type: ignore[attr-defined]
            self.port = sockets[0].getsockname()[1] if sockets else self.conf.port
        except BaseException:
            await self.stop()
            raise

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        async with asyncio.timeout(timeout_s):
            await self.state.ready.wait()
            await self.plans.ready.wait()

    async def stop(self) -> None:
        self._stop.set()
        exits, self._exits = self._exits, contextlib.AsyncExitStack()
        try:
            await exits.aclose()
        finally:
            self._runner = self._kube = self._follower = self._producer = self._pool = None
            self._plan_feeds.clear()

    async def _start_plan_feeds(self, exits: contextlib.AsyncExitStack) -> None:
        """One reader per topic (the config feed's plumbing): each caught up at the end
        offsets of the start, so /readyz can wait for all four."""
        for name in PLAN_TOPICS:
            feed = CompactedFollower(
                self.settings,
                topic(self.env, name),
                self._take,
                client_id=f"gateway-{name}",
                poll_ms=self.conf.plan_poll_ms,
                missing=f"is env {self.env!r} created? (`dlrover-events env list`)",
            )
            await feed.start()
            exits.push_async_callback(feed.stop)
            self._plan_feeds.append(feed)

    def _take(self, records: list[ConsumerRecord]) -> None:
        events: list[JobEvent] = []
        for r in records:
            got = read_record(self.env, r)
            if isinstance(got, str):
                self.plans.rejected += 1
                log.debug("skipped %s[%d]@%d: %s", r.topic, r.partition, r.offset, got)
            elif got is not None:
                events.append(got)
        if events:
            self.plans.apply(events)

    async def _plans_caught_up(self) -> None:
        for feed in self._plan_feeds:
            await feed.caught_up.wait()
        self.plans.ready.set()
        log.info("gateway of env %s: %d jobs' plans read", self.env, len(self.plans))

    async def _follow(self) -> None:
        assert self._follower is not None
        await self._follower.run(self._stop)

    async def _reconcile(self, store: ConfigStore) -> None:
        """Once caught up, put back on the topic what Postgres has and the topic lacks."""
        await self.state.ready.wait()
        try:
            await store.reconcile(self.state.known_versions())
        except Exception:
            log.exception("could not reconcile the config topic with Postgres")

    async def _start_configmaps(self, store: ConfigStore, exits: contextlib.AsyncExitStack) -> None:
        """Credentials are checked here, so a wrong kubeconfig fails the start, loudly;
        the cluster being away later is only retried."""
        from handlers.gateway.configmaps import ConfigMapSync
        from handlers.gateway.configmaps_runner import ConfigMapWatcher, connect

        api, namespace = await connect(self.conf.kubeconfig, self.conf.context, self.conf.namespace)
        self._kube = api
        exits.push_async_callback(api.close)
        sync = ConfigMapSync(store, namespace, self.env, self.conf.configmap_key)
        self.configmaps = ConfigMapWatcher(
            api, namespace, sync, watch_timeout_s=self.conf.watch_timeout_s
        )
        # (its task ends before its client closes)
        await exits.enter_async_context(
            background(self.configmaps.run(self._stop), name="gateway-configmaps")
        )
        log.info("config gateway of env %s syncs ConfigMaps of namespace %s", self.env, namespace)

    async def _bootstrap_admin(self, tokens: Tokens, token: str) -> None:
        await tokens.add(f"boot-{hash_token(token)[:8]}", token, "bootstrap admin", [Scope.ADMIN])
