"""The watchdog: when the real env fails too many jobs, a pre-chosen standby takes over.

The decision is a pure function of the real env's ledger, judged in event time (the
newest event seen), so it behaves the same on a simulated clock as on a real one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import typer
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from dlrover_events.cli.app import run_async
from dlrover_events.embedded import resolve_postgres
from dlrover_events.envs import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.fence import fenced
from dlrover_events.services import Service, ServiceContext
from dlrover_events.settings import load_settings
from dlrover_events.tail import Line, parse_since
from dlrover_events.tailer import follow
from dlrover_events.topics import JOB_EVENTS, check_env_name
from schemas.control import EnvMode
from streams.evaluators.ledger import Ledger

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchdogPolicy:
    standby: str
    failed_rate: float = 0.5
    window: timedelta = timedelta(hours=1)
    min_finished: int = 5


def failover_reason(ledger: Ledger, policy: WatchdogPolicy) -> str | None:
    """Why the standby should take over now, or None."""
    now = ledger.last_event_at
    if now is None:
        return None
    since = now - policy.window
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
    standby = await registry.get(policy.standby)
    if standby is None or standby.mode != EnvMode.VIRTUAL:
        raise UserError(f"standby {policy.standby!r} must be an existing virtual env")
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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ctx.stop.wait(), check_every_s)
            if tail.done():
                tail.result()
            reason = failover_reason(ledger, policy)
            if reason is not None:
                await registry.promote(policy.standby, reason=reason)
                log.warning("%s: %s took over from %s", reason, policy.standby, ctx.env)
                return reason
        return ""
    finally:
        tail_stop.set()
        await asyncio.gather(tail, return_exceptions=True)


def parse_window(text: str, option: str = "--window") -> timedelta:
    """``30m``, ``1h``, ``1d`` as a span; a bad one is a one-line user error."""
    try:
        return datetime.now().astimezone() - parse_since(text)
    except ValueError as err:
        raise UserError(str(err).replace("--since", option)) from None


class WatchdogSettings(BaseSettings):
    """The watchdog as a service of `up` (DLROVER_EVENTS_WATCHDOG_*). Without a standby
    it only says so and idles: failover is opt-in."""

    model_config = SettingsConfigDict(env_prefix="DLROVER_EVENTS_WATCHDOG_", extra="ignore")

    standby: str | None = Field(default=None, description="virtual env that takes over")
    failed_rate: float = Field(default=0.5, ge=0.0, le=1.0)
    window: str = "1h"
    min_finished: int = Field(default=5, ge=1)
    check_every_s: float = Field(default=2.0, gt=0)

    def policy(self) -> WatchdogPolicy | None:
        if not self.standby:
            return None
        check_env_name(self.standby)
        span = parse_window(self.window, "DLROVER_EVENTS_WATCHDOG_WINDOW")
        return WatchdogPolicy(self.standby, self.failed_rate, span, self.min_finished)


async def run_service(ctx: ServiceContext) -> None:
    """Watch ``ctx.env`` until it fails over, then idle until stopped: returning would
    make `up` start it again, on an env that is no longer the real one."""
    try:
        settings = WatchdogSettings()
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(f"DLROVER_EVENTS_WATCHDOG_{where.upper()}: {first['msg']}") from None
    policy = settings.policy()
    if policy is None:
        ctx.endpoints["failover"] = "off (set DLROVER_EVENTS_WATCHDOG_STANDBY to a virtual env)"
        ctx.ready.set()
        await ctx.stop.wait()
        return
    ctx.endpoints["failover"] = (
        f"to {policy.standby} when >= {policy.failed_rate:.0%} of >= {policy.min_finished}"
        f" jobs finished in {policy.window} failed"
    )
    reason = await watch(ctx, policy, settings.check_every_s)
    if reason:
        await ctx.stop.wait()


service = Service(
    name="watchdog",
    description="failover: promotes the standby env when the real env fails too many jobs",
    run=run_service,
)


def watchdog_command(
    standby: str = typer.Option(..., help="virtual env that takes over"),
    env: str | None = typer.Option(None, "--env", "-e", help="real env to watch (default: it)"),
    failed_rate: float = typer.Option(0.5, min=0.0, max=1.0, help="failed share that trips"),
    window: str = typer.Option("1h", help="window of finished jobs: 30m, 1h, 1d"),
    min_finished: int = typer.Option(5, min=1, help="finished jobs needed before judging"),
) -> None:
    """Watch the real env; when too many jobs fail, promote the standby env."""
    check_env_name(standby)
    policy = WatchdogPolicy(standby, failed_rate, parse_window(window), min_finished)
    settings = load_settings()

    async def go() -> None:
        pg = await resolve_postgres(settings)
        real = env or (r.name if (r := await EnvRegistry(settings, pg.dsn).real()) else None)
        if real is None:
            raise UserError("there is no real env to watch")
        ctx = ServiceContext(settings, real, pg.dsn)
        async with fenced(ctx):
            reason = await watch(ctx, policy)
        if not reason:
            raise UserError(f"env {real!r} was deleted; the watchdog stopped")
        typer.echo(f"{standby} took over from {real}: {reason}")

    run_async(go())
