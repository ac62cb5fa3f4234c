"""`dlrover-events operator --env E --platform hosts`: the real env's TrainingJobs on plain
hosts, each running `dlrover-events agent`.

The reconciler is the one of every platform (handlers.operator.reconcile); under it, the
hosts platform (handlers.operator.hosts.cluster) places pods on the agents and follows
them over the bus. It serves only the real env: its pods are real processes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.errors import UserError
from dlrover_events.lifecycle import wait_for_any
from dlrover_events.runtime.metrics import OperatorMetrics
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.sdk.identity import CHECKPOINT_DIR_ENV
from dlrover_events.settings import Settings
from handlers.operator.hosts.cluster import HostsCluster
from handlers.operator.local.runner import gateway_access
from handlers.operator.platform.registry import operator_settings
from handlers.operator.reconcile.reconciler import EnvReconciler, StepHook
from schemas.control import EnvMode

log = logging.getLogger(__name__)


class HostsSettings(BaseSettings):
    """The hosts platform's knobs (DLROVER_EVENTS_HOSTS_*), options on top."""

    model_config = SettingsConfigDict(env_prefix="DLROVER_EVENTS_HOSTS_", extra="ignore")

    lost_after_s: float = Field(
        default=6.0,
        gt=0,
        le=600,
        description="a host whose agent has not reported for this long is lost: its pods "
        "are gone, an elastic job goes on smaller (agents report every second)",
    )
    poll_s: float = Field(
        default=0.25, gt=0, le=10, description="how often it judges hosts, places and orders pods"
    )
    gateway_url: str | None = Field(
        default=None,
        description="where the pods' SDK follows its plans (an address the hosts reach); "
        "unset: DLROVER_EVENTS_GATEWAY_URL, else 127.0.0.1:8470",
    )
    resync_seconds: float = Field(
        default=30.0, gt=0, description="every job is reconciled at least this often"
    )
    end_jobs_on_exit: bool = Field(
        default=False,
        description="a clean stop orders every host to end the jobs' pods; off: they train "
        "on, and the next operator takes them up",
    )
    checkpoint_dir: str | None = Field(
        default=None,
        description="where the SDK's checkpoint helper keeps a job's file (a directory "
        "every host sees: a shared filesystem); unset: the job's own",
    )


def platform_root(settings: Settings, env: str) -> Path:
    """Where the env's jobs and pod records live: the data dir, shared with `job`."""
    return settings.data_dir.expanduser().resolve() / "hosts" / env


def hosts_settings(options: Mapping[str, Any]) -> HostsSettings:
    return operator_settings(HostsSettings, options, "hosts")


async def run(
    ctx: ServiceContext, options: Mapping[str, Any], *, on_step: StepHook | None = None
) -> None:
    conf = hosts_settings(options)
    record = await EnvRegistry(ctx.settings, ctx.pg_dsn).get(ctx.env)
    if record is None or record.mode != EnvMode.REAL:
        raise UserError(
            f"env {ctx.env} is not the real env: the hosts platform runs real training "
            "processes, so only the real env's operator uses it"
        )
    root = platform_root(ctx.settings, ctx.env)
    root.mkdir(parents=True, exist_ok=True)
    access = await gateway_access(ctx.env, ctx.pg_dsn, root, conf.gateway_url)
    if conf.checkpoint_dir:
        access[CHECKPOINT_DIR_ENV] = conf.checkpoint_dir
    cluster = HostsCluster(
        root,
        settings=ctx.settings,
        env=ctx.env,
        runs_pods=True,
        base_env=access,
        poll_s=conf.poll_s,
        lost_after_s=conf.lost_after_s,
    )
    ctx.endpoints["hosts platform"] = f"{root} (hosts lost after {conf.lost_after_s:g} s)"
    reconciler = EnvReconciler(
        ctx.settings,
        ctx.env,
        ctx.pg_dsn,
        cluster,
        resync_s=conf.resync_seconds,
        on_step=on_step,
        metrics=OperatorMetrics(ctx.metrics, ctx.env, "hosts"),
        capacity=cluster,
    )
    await cluster.start()
    log.warning(
        "hosts platform of env %s: jobs under %s; %d agent(s) known",
        ctx.env,
        root,
        len(cluster.hosts),
    )
    try:
        running = asyncio.create_task(reconciler.run(ctx.stop), name=f"{ctx.env}.hosts")
        if await wait_for_any([reconciler.ready], [running]):
            ctx.ready.set()
        await running
    finally:
        await cluster.stop(end_pods=conf.end_jobs_on_exit)


__all__ = ["HostsSettings", "platform_root", "run"]
