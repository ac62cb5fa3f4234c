"""Starting and stopping one console: its envs (token checks, hubs), a producer for the
actions, the HTTP site. Shared by the command, the `up` service and the tests, so they all
run the same thing."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from aiohttp import web
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from dlrover_events.bus.producer import Producer
from dlrover_events.lifecycle import AsyncResource
from dlrover_events.settings import Settings
from handlers.console.actions import Actor, PlatformOptions
from handlers.console.app import build_app
from handlers.console.envs import BoardSizes, EnvViews
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
    max_envs: int = Field(
        default=4,
        ge=1,
        description="envs followed at once (the home env and those pages asked for); past "
        "it the one asked for longest ago with no page open is let go",
    )
    max_jobs: int = Field(
        default=2000, ge=1, description="jobs kept per env; the quietest are forgotten first"
    )
    timeline: int = Field(
        default=50, ge=1, description="entries of a job's timeline kept (plans, results, ...)"
    )
    points: int = Field(
        default=240,
        ge=4,
        description="points of a job's charts kept; past it they are thinned, so a chart "
        "still spans the job's life",
    )
    dead_letters: int = Field(default=200, ge=1, description="dead letters kept per env")
    platform: Literal["local", "kubernetes"] = Field(
        default="local",
        description="where the real env's jobs are scaled, suspended, resumed and deleted "
        "from the console: "
        "local (the local platform `up` runs) or kubernetes (the job commands' cluster)",
    )
    kubeconfig: Path | None = Field(
        default=None,
        description="platform kubernetes: kubeconfig (default $KUBECONFIG, ~/.kube/config, "
        "in-cluster)",
    )
    namespace: str | None = Field(
        default=None, description="platform kubernetes: namespace of the TrainingJobs"
    )
    ab_reports: list[Path] = Field(
        default=["ab-report"],
        validate_default=True,
        description='folders of `ab run --out` results (a JSON list: ["ab-report", "/runs"]); '
        "each holds a summary.json, or folders that do",
    )


class ConsoleServer(AsyncResource):
    def __init__(
        self, settings: Settings, env: str, dsn: str, conf: ConsoleSettings | None = None
    ) -> None:
        self.settings = settings
        self.env = env
        self.dsn = dsn
        self.conf = conf or ConsoleSettings()
        c = self.conf
        self.views = EnvViews(
            settings,
            dsn,
            env,
            sizes=BoardSizes(
                backlog=c.backlog,
                queue=c.queue,
                max_jobs=c.max_jobs,
                timeline=c.timeline,
                points=c.points,
                letters=c.dead_letters,
            ),
            max_envs=c.max_envs,
            token_cache_s=c.token_cache_s,
        )
        self.port = 0
        self._producer: Producer | None = None
        self._runner: web.AppRunner | None = None

    @property
    def hub(self) -> Hub:
        """The home env's hub."""
        return self.views.home_hub()

    @property
    def url(self) -> str:
        host = self.conf.host if self.conf.host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port}/"

    async def start(self) -> None:
        c = self.conf
        try:
            await self.views.start()
            self._producer = Producer(self.settings)
            await self._producer.start()
            actor = Actor(
                self.settings,
                self.views,
                self._producer,
                PlatformOptions(c.platform, c.kubeconfig, c.namespace),
            )
            app = build_app(self.views, actor, tuple(c.ab_reports))
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, c.host, c.port)
            await site.start()
            sockets = site._server.sockets if site._server is not None else []  # type: ignore[attr-defined]
            self.port = sockets[0].getsockname()[1] if sockets else c.port
        except BaseException:
            await self.stop()
            raise

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until the home env's hub follows every topic of the env (it may still be
        replaying)."""
        await self.views.wait_ready(timeout_s)

    async def stop(self) -> None:
        if self._runner is not None:
            self.views.close_feeds()  # first: the site does not wait for idle pages
            await self._runner.cleanup()
            self._runner = None
        await self.views.stop()
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
