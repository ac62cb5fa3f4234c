"""Which operator an env gets: the one place that looks at the env's mode.

Both the `operator` command and the `operator` service come here, so the real-cluster
reconciler is added by one line in RUNNERS, not by a second dispatch elsewhere. Runners are
imported only once chosen: a virtual env's process never imports a Kubernetes client.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from dlrover_events.bus.topics import check_env_name
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.runtime.services import ServiceContext
from handlers.operator.platform.registry import DEFAULT_PLATFORM, PLATFORMS
from schemas.control import EnvMode

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
    await runner_for(mode, platform)(ctx, options)
