"""Which operator an env gets: the one place that looks at the env's mode.

Both the `operator` command and the `operator` service come here, so the real-cluster
reconciler is added by one line in RUNNERS, not by a second dispatch elsewhere. Runners are
imported only once chosen: a virtual env's process never imports a Kubernetes client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from dlrover_events.bus.topics import check_env_name
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.envs.role_watch import RoleWatch
from dlrover_events.errors import UserError
from dlrover_events.lifecycle import background, wait_for_any
from dlrover_events.runtime.services import ServiceContext
from handlers.operator.platform.registry import DEFAULT_PLATFORM, PLATFORMS
from schemas.control import EnvMode

log = logging.getLogger(__name__)

#: (context, options given on the command line) -> runs until ctx.stop is set.
Runner = Callable[[ServiceContext, Mapping[str, Any]], Awaitable[None]]

#: "module:function" of each mode's runner.
RUNNERS: Mapping[EnvMode, str] = {
    EnvMode.VIRTUAL: "handlers.operator.virtual.operator:run",
    EnvMode.REAL: "handlers.operator.kube.runner:run",
}

#: Option (or DLROVER_EVENTS_OPERATOR_FOLLOW_REAL) that runs the real operator whatever the
#: env's mode now: it acts for whichever env is real and moves with promotions.
FOLLOW_REAL = "follow_real"


def follows_real(options: Mapping[str, Any]) -> bool:
    given = options.get(FOLLOW_REAL)
    if given is None:
        given = os.environ.get("DLROVER_EVENTS_OPERATOR_FOLLOW_REAL", "")
    return str(given).strip().lower() in ("1", "true", "yes", "on")


#: Option (or DLROVER_EVENTS_OPERATOR_PLATFORM) naming where the real env's jobs run.
PLATFORM = "platform"


def platform_of(options: Mapping[str, Any]) -> str:
    given = options.get(PLATFORM) or os.environ.get("DLROVER_EVENTS_OPERATOR_PLATFORM", "")
    return PLATFORMS[str(given).strip().lower() or DEFAULT_PLATFORM].name


def runner_for(mode: EnvMode, platform: str = DEFAULT_PLATFORM) -> Runner:
    target = PLATFORMS[platform].operator if mode == EnvMode.REAL else RUNNERS.get(mode)
    if target is None:
        raise UserError(
            f"no operator for {mode.value} envs is installed; the virtual operator runs only "
            "in virtual envs (see `dlrover-events env list`)"
        )
    module, _, name = target.partition(":")
    runner: Runner = getattr(importlib.import_module(module), name)
    return runner


async def run_operator(ctx: ServiceContext, options: Mapping[str, Any] | None = None) -> None:
    """Run the operator that the env's mode calls for, until ``ctx.stop`` is set."""
    check_env_name(ctx.env)
    record = await EnvRegistry(ctx.settings, ctx.pg_dsn).get(ctx.env)
    if record is None:
        raise UserError(
            f"no env named {ctx.env!r}; create it with `dlrover-events env create {ctx.env}`"
        )
    options = dict(options or {})
    platform = platform_of(options)
    mode = EnvMode.REAL if follows_real(options) else record.mode
    if mode != EnvMode.REAL and PLATFORM in options:
        raise UserError(
            f"env {ctx.env} is virtual: its operator is the simulator, on no platform "
            "(--platform is for the real env)"
        )
    if platform == DEFAULT_PLATFORM:
        options.pop(PLATFORM, None)
    runner = runner_for(mode, platform)
    if mode == EnvMode.VIRTUAL:
        await until_promoted(ctx, runner, options)
    else:
        await runner(ctx, options)


async def until_promoted(ctx: ServiceContext, runner: Runner, options: Mapping[str, Any]) -> None:
    """A virtual env's simulator, stopped once its env is promoted: simulated answers to
    the real env's plans would tell its brain that real jobs were rescaled, and it shares
    the env's operator group with the real operator that now acts for the env (one that
    follows the real env: DLROVER_EVENTS_OPERATOR_FOLLOW_REAL), which would get only some
    of the plans. It then idles until stopped: the real operator is another process's."""
    promoted = RoleWatch(ctx.env, was_real=False)
    inner = dataclasses.replace(ctx, stop=asyncio.Event())

    async def relay() -> None:
        await wait_for_any([ctx.stop, promoted.changed])
        inner.stop.set()

    async with background(promoted.follow(ctx.settings, ctx.stop), relay()):
        await runner(inner, options)
    if promoted.changed.is_set() and not ctx.stop.is_set():
        log.warning(
            "env %s is the real env now: its simulated cluster stopped; the operator that "
            "follows the real env acts for it",
            ctx.env,
        )
        ctx.endpoints["operator"] = f"stopped: {ctx.env} is the real env now"
        await ctx.stop.wait()
