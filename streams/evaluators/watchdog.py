"""The watchdog: when the real env fails too many jobs, a pre-chosen standby takes over.

The decision is a pure function of the real env's ledger, judged in event time (the
newest event seen), so it behaves the same on a simulated clock as on a real one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import typer
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from dlrover_events.bus.tail import Line
from dlrover_events.bus.tailer import follow
from dlrover_events.bus.topics import JOB_EVENTS, check_env_name
from dlrover_events.cli.params import env_name
from dlrover_events.cli.runner import run_async
from dlrover_events.domain.units import parse_duration
from dlrover_events.envs.failover import last_switch
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import EnvError, UserError
from dlrover_events.lifecycle import wait_or_stop
from dlrover_events.runtime.embedded import resolve_postgres
from dlrover_events.runtime.services import Service, ServiceContext
from dlrover_events.runtime.standalone import serve_alone
from dlrover_events.settings import load_settings
from schemas.control import EnvMode
from streams.evaluators.ledger import Ledger

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchdogPolicy:
    standby: str
    failed_rate: float = 0.5
    window: timedelta = timedelta(hours=1)
    min_finished: int = 5


def failover_reason(
    ledger: Ledger, policy: WatchdogPolicy, real_since: datetime | None = None
) -> str | None:
    """Why the standby should take over now, or None. Only jobs that finished while the
    env was real count (``real_since``: when it last became real): an env promoted back
    after a failover is not judged again on the failures that made it fail over."""
    now = ledger.last_event_at
    if now is None:
        return None
    since = now - policy.window
    if real_since is not None and real_since > since:
        since = real_since
    finished = [
        j for j in ledger.jobs.values() if j.finished_at is not None and j.finished_at >= since
    ]
    if len(finished) < policy.min_finished:
        return None
    failed = sum(1 for j in finished if j.failed)
    rate = failed / len(finished)
    if rate < policy.failed_rate:
        return None
    return (
        f"watchdog: {failed} of {len(finished)} jobs failed in the last "
        f"{policy.window} (rate {rate:.2f} >= {policy.failed_rate:.2f})"
    )


async def watch(ctx: ServiceContext, policy: WatchdogPolicy, check_every_s: float = 2.0) -> str:
    """Follow the env until the policy trips; then promote the standby. Returns the reason."""
    registry = EnvRegistry(ctx.settings, ctx.pg_dsn)
    env = await registry.get(ctx.env)
    if env is None or env.mode != EnvMode.REAL:
        raise UserError(f"the watchdog watches the real env; {ctx.env!r} is not it")
    standby = Standby(registry, policy.standby, ctx)
    await standby.ready()  # said once when it is not: the watchdog goes on, and looks again
    switch = last_switch(await registry.changes())
    real_since = switch.at if switch is not None and switch.to == ctx.env else None
    ledger = Ledger()

    def fold(line: Line) -> None:
        if line.event is not None:
            ledger.observe(line.event)

    # its own stop: ending the tail must not stop whoever runs this (`up`'s other parts)
    tail_stop = asyncio.Event()
    tail = asyncio.create_task(
        follow(ctx.settings, ctx.env, [JOB_EVENTS], fold, start="earliest", stop=tail_stop)
    )
    ctx.ready.set()
    try:
        while not ctx.stop.is_set():
            await wait_or_stop(ctx.stop, check_every_s)
            if tail.done():
                tail.result()
            reason = failover_reason(ledger, policy, real_since)
            if reason is not None and await standby.ready():
                try:
                    await registry.promote(policy.standby, reason=reason)
                except EnvError as err:  # deleted, or promoted by hand, meanwhile
                    log.warning("the watchdog could not promote %s: %s", policy.standby, err)
                    continue
                log.warning("%s: %s took over from %s", reason, policy.standby, ctx.env)
                return reason
        return ""
    finally:
        tail_stop.set()
        await asyncio.gather(tail, return_exceptions=True)


def standby_problem(name: str, mode: EnvMode | None) -> str | None:
    """Why ``name`` cannot be promoted now, or None (pure): it must be a virtual env."""
    if mode is None:
        return (
            f"standby {name!r} is not an env (yet): the watchdog keeps watching and promotes "
            f"it once it exists (`dlrover-events env create {name}`; `up` and `bootstrap` "
            "make it)"
        )
    if mode != EnvMode.VIRTUAL:
        return f"standby {name!r} is the {mode.value} env, not a virtual one: nothing to promote"
    return None


class Standby:
    """The standby as the watchdog sees it: looked up again each time it is asked, and a
    problem said once (a warning, and on the service's endpoints), not once a check."""

    def __init__(self, registry: EnvRegistry, name: str, ctx: ServiceContext) -> None:
        self.registry = registry
        self.name = name
        self.ctx = ctx
        self._said: str | None = None

    async def ready(self) -> bool:
        record = await self.registry.get(self.name)
        problem = standby_problem(self.name, record.mode if record is not None else None)
        if problem is not None and problem != self._said:
            log.warning("%s", problem)
            self.ctx.endpoints["standby"] = problem
        elif problem is None and self._said is not None:
            log.warning("standby %s is a virtual env now: the watchdog may promote it", self.name)
            self.ctx.endpoints["standby"] = f"{self.name} (virtual)"
        self._said = problem
        return problem is None


def parse_window(text: str, option: str = "--window") -> timedelta:
    """``30m``, ``1h``, ``1d`` (the one duration syntax) as a span; a bad one is a one-line
    user error."""
    try:
        return timedelta(seconds=parse_duration(text))
    except (ValueError, OverflowError) as err:
        raise UserError(f"{option} {err}") from None


class WatchdogSettings(BaseSettings):
    """The watchdog as a service of `up` (DLROVER_EVENTS_WATCHDOG_*). Without a standby
    it only says so and idles: failover is opt-in."""

    model_config = SettingsConfigDict(env_prefix="DLROVER_EVENTS_WATCHDOG_", extra="ignore")

    standby: str | None = Field(default=None, description="virtual env that takes over")
    failed_rate: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="share of failed jobs in the window that fails over",
    )
    window: str = Field(default="1h", description="the span of finished jobs judged (30m, 1h, 1d)")
    min_finished: int = Field(
        default=5, ge=1, description="fewer jobs finished in the window decide nothing"
    )
    check_every_s: float = Field(
        default=2.0, gt=0, description="seconds between looks at the real env"
    )

    def policy(self) -> WatchdogPolicy | None:
        if not self.standby:
            return None
        check_env_name(self.standby)
        span = parse_window(self.window, "DLROVER_EVENTS_WATCHDOG_WINDOW")
        return WatchdogPolicy(self.standby, self.failed_rate, span, self.min_finished)


def _watchdog_settings(**given: Any) -> WatchdogSettings:
    """DLROVER_EVENTS_WATCHDOG_* under ``given`` (a command's flags); a bad value is one line."""
    try:
        return WatchdogSettings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(f"DLROVER_EVENTS_WATCHDOG_{where.upper()}: {first['msg']}") from None


async def guard(ctx: ServiceContext, policy: WatchdogPolicy, check_every_s: float = 2.0) -> None:
    """Watch ``ctx.env`` until it fails over, then idle until stopped: returning would
    make `up` start it again (and a Deployment restart it) on an env that is no longer the
    real one. Started after a failover (the standby is real already), it only idles."""
    standby = await EnvRegistry(ctx.settings, ctx.pg_dsn).get(policy.standby)
    if standby is not None and standby.mode == EnvMode.REAL:
        log.warning(
            "the standby %s is the real env already (failed over before): nothing to watch",
            policy.standby,
        )
        ctx.endpoints["failover"] = f"done: {policy.standby} is the real env"
        ctx.ready.set()
        await ctx.stop.wait()
        return
    ctx.endpoints["failover"] = (
        f"to {policy.standby} when >= {policy.failed_rate:.0%} of >= {policy.min_finished}"
        f" jobs finished in {policy.window} failed"
    )
    reason = await watch(ctx, policy, check_every_s)
    if reason:
        ctx.endpoints["failover"] = f"done: {reason}"
        await ctx.stop.wait()


async def run_service(ctx: ServiceContext) -> None:
    """The watchdog of `up`: DLROVER_EVENTS_WATCHDOG_*; without a standby it only idles."""
    settings = _watchdog_settings()
    policy = settings.policy()
    if policy is None:
        ctx.endpoints["failover"] = "off (set DLROVER_EVENTS_WATCHDOG_STANDBY to a virtual env)"
        ctx.ready.set()
        await ctx.stop.wait()
        return
    await guard(ctx, policy, settings.check_every_s)


service = Service(
    name="watchdog",
    description="failover: promotes the standby env when the real env fails too many jobs",
    run=run_service,
)


def watchdog_command(
    standby: str | None = typer.Option(
        None,
        parser=env_name,
        help="virtual env that takes over (default DLROVER_EVENTS_WATCHDOG_STANDBY)",
    ),
    env: str | None = typer.Option(
        None, "--env", "-e", parser=env_name, help="real env to watch (default: it)"
    ),
    failed_rate: float | None = typer.Option(
        None, min=0.0, max=1.0, help="failed share that trips (default 0.5)"
    ),
    window: str | None = typer.Option(
        None, metavar="DURATION", help="window of finished jobs: 30m, 1h (default), 1d"
    ),
    min_finished: int | None = typer.Option(
        None, min=1, help="finished jobs needed before judging (default 5)"
    ),
) -> None:
    """Watch the real env; when too many jobs fail, promote the standby env, then keep
    running (a Deployment's container) until Ctrl-C or SIGTERM."""
    conf = _watchdog_settings(
        standby=standby, failed_rate=failed_rate, window=window, min_finished=min_finished
    )
    policy = conf.policy()
    if policy is None:
        raise UserError("name the standby env: --standby or DLROVER_EVENTS_WATCHDOG_STANDBY")
    settings = load_settings()

    async def go() -> None:
        watched = env
        if watched is None:
            pg = await resolve_postgres(settings)
            try:
                real = await EnvRegistry(settings, pg.dsn).real()
            finally:
                pg.stop()
            if real is None:
                raise UserError("there is no real env to watch")
            watched = real.name

        def say(ctx: ServiceContext) -> None:
            typer.echo(
                f"watchdog of env {watched}: failover {ctx.endpoints['failover']} (metrics: "
                f"{ctx.endpoints['metrics']}, /healthz and /readyz beside them)",
                err=True,
            )

        run = functools.partial(guard, policy=policy, check_every_s=conf.check_every_s)
        await serve_alone(settings, watched, "watchdog", run, on_ready=say)

    run_async(go())
