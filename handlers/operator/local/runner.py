"""`dlrover-events operator --env E --platform local`: the real env's TrainingJobs as
processes on this machine, and the `local` service of `dlrover-events up`.

The reconciler is the one of every platform (handlers.operator.reconcile: plans applied
once through the env's ledger and the job documents, node and job events, ScaleResults);
only the platform under it differs. The local platform runs real jobs, so it serves only
the real env: a virtual env's operator is the simulator.

Across a promotion (`env promote`, the watchdog): the new real env's operator takes the
machine's jobs over (``handover.py``: its folder links to the old real env's, so their
processes are adopted, none started again), and the demoted env's operator is fenced the
moment dlrover.control says another env is real: its writes are refused
(platform.FencedPlatform), its reconciler stops, and it leaves the jobs' processes running
for the new real env, even where a clean stop would end them (``end_jobs_on_exit``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from dlrover_events.bus.producer import Producer
from dlrover_events.checkpoints.store import CheckpointStore
from dlrover_events.config.client import TOKEN_ENV, URL_ENV
from dlrover_events.envs.failover import last_switch
from dlrover_events.envs.registry import EnvRegistry
from dlrover_events.envs.role_watch import RoleWatch
from dlrover_events.envs.tokens import Scope, Tokens, job_scope, token_env
from dlrover_events.errors import UserError
from dlrover_events.experiments.store import ExperimentStore
from dlrover_events.lifecycle import background, wait_for_any
from dlrover_events.pods.memory import available
from dlrover_events.runtime.metrics import OperatorMetrics
from dlrover_events.runtime.services import Service, ServiceContext
from dlrover_events.sdk.identity import CHECKPOINT_DIR_ENV
from dlrover_events.settings import Settings
from dlrover_events.store import EnvStore
from handlers.experiments.http import PREFIX, experiments_app
from handlers.experiments.models import CHECKPOINTS_PREFIX, MODELS_PREFIX, mount
from handlers.operator.document.trainingjob import ANN_WORKDIR
from handlers.operator.doors.http import jobs_app
from handlers.operator.local.cluster import LocalCluster
from handlers.operator.local.handover import hand_over
from handlers.operator.local.store import read_json, write_json
from handlers.operator.platform.bodies import JobView
from handlers.operator.platform.fencing import FencedPlatform
from handlers.operator.platform.registry import operator_settings
from handlers.operator.reconcile.reconciler import EnvReconciler, StepHook
from schemas.control import EnvMode

log = logging.getLogger(__name__)

#: What a node's process inherits from the operator's environment besides its own env.
_PASSED = ("HOME", "LANG", "LC_ALL", "TMPDIR", "USER")
DEFAULT_GATEWAY_URL = "http://127.0.0.1:8470"


class LocalSettings(BaseSettings):
    """The local platform's knobs (DLROVER_EVENTS_LOCAL_*), options on top."""

    model_config = SettingsConfigDict(env_prefix="DLROVER_EVENTS_LOCAL_", extra="ignore")

    end_jobs_on_exit: bool = Field(
        default=True,
        description="a clean stop ends the jobs' processes (a restart starts them again); "
        "a killed operator leaves them running for the next one to adopt",
    )
    poll_s: float = Field(
        default=0.25,
        gt=0,
        le=10,
        description="how often the platform scans its jobs and nodes (starts, ends, changes)",
    )
    gateway_url: str | None = Field(
        default=None,
        description="where the nodes' SDK follows its plans; unset: "
        "DLROVER_EVENTS_GATEWAY_URL, else the gateway `up` starts (127.0.0.1:8470)",
    )
    resync_seconds: float = Field(
        default=30.0, gt=0, description="every job is reconciled at least this often"
    )
    api_host: str = Field(default="127.0.0.1", description="the jobs API (admin token)")
    api_port: int | None = Field(
        default=8490, ge=0, le=65535, description="the jobs API's port; unset: no API"
    )
    slots: int | None = Field(
        default=None,
        ge=0,
        le=4096,
        description="what this machine has for jobs, as GPUs (`--slots N`): a pod takes the "
        "GPUs it names, else one, and waits for them; published as the env's capacity "
        "(one host); unset: not counted, nothing waits (the capacity report says so)",
    )


def platform_root(settings: Settings, env: str) -> Path:
    """Where the env's local jobs and nodes live: the data dir, shared with `job`."""
    return settings.data_dir.expanduser().resolve() / "local" / env


def node_env(settings: Settings) -> dict[str, str]:
    """What every node's process starts with: this Python's tools first on PATH (so
    `torchrun` and `python` are the project's), and where the bus is."""
    bin_dir = str(Path(sys.executable).parent)
    env = {k: os.environ[k] for k in _PASSED if k in os.environ}
    env["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "/usr/bin:/bin")])
    env["PYTHONUNBUFFERED"] = "1"
    env["DLROVER_EVENTS_BOOTSTRAP_SERVERS"] = settings.bootstrap_servers
    return env


async def gateway_access(env: str, dsn: str, root: Path, url: str | None = None) -> dict[str, str]:
    """Where a node's SDK finds the gateway, with a read-scoped token of the env (minted
    once and kept, owner-only, in the platform's dir): enough to follow its plans and read
    its config, nothing more."""
    url = url or os.environ.get(URL_ENV) or DEFAULT_GATEWAY_URL
    # one file per env: after a promotion the folder is shared (handover.py), and a pod of
    # the new real env must get its own env's token, not the one of the env before
    path = root / f"gateway-token.{env}"
    legacy = root / "gateway-token"
    if not path.exists() and legacy.exists() and token_env(legacy.read_text().strip()) == env:
        path = legacy
    if path.exists():
        token = path.read_text().strip()
    else:
        store = await EnvStore.open(dsn, env, max_size=1)
        try:
            _, token = await Tokens(store.pool, env).mint("local-platform", [Scope.READ])
        finally:
            await store.close()
        path.touch(mode=0o600)
        path.write_text(token)
    return {URL_ENV: url, TOKEN_ENV: token}


class LocalJobTokens:
    """Each job's own token (``job_scope``: its scale requests, nothing else), for the pods
    of its roles that scale others: minted at the job's first such pod, kept owner-only in
    the platform's dir (a restarted operator gives the same token), revoked once the job
    is gone."""

    def __init__(self, tokens: Tokens, root: Path) -> None:
        self.tokens = tokens
        self.dir = root / "job-tokens"

    async def token(self, job: JobView) -> str:
        path = self.dir / f"{job.name}.json"
        kept = read_json(path)
        if kept is not None and kept.get("uid") == job.uid:
            return str(kept["token"])
        if kept is not None:  # an earlier job of that name
            await self.tokens.revoke(str(kept.get("token_id")))
        token_id, token = await self.tokens.mint(f"job/{job.name}", [job_scope(job.uid)])
        self.dir.mkdir(mode=0o700, exist_ok=True)  # owner-only: the tokens are in clear
        write_json(path, {"uid": job.uid, "token_id": token_id, "token": token})
        return token

    async def revoke(self, job: str) -> None:
        path = self.dir / f"{job}.json"
        kept = read_json(path)
        if kept is None:
            return
        if await self.tokens.revoke(str(kept.get("token_id"))):
            log.info("revoked the token of job %s", job)
        path.unlink(missing_ok=True)


def local_settings(options: Mapping[str, Any]) -> LocalSettings:
    return operator_settings(LocalSettings, options, "local")


async def run(
    ctx: ServiceContext, options: Mapping[str, Any], *, on_step: StepHook | None = None
) -> None:
    conf = local_settings(options)
    record = await EnvRegistry(ctx.settings, ctx.pg_dsn).get(ctx.env)
    if record is None or record.mode != EnvMode.REAL:
        raise UserError(
            f"env {ctx.env} is not the real env: the local platform runs real training "
            "processes, so only the real env's operator uses it (a virtual env's operator is "
            "the simulator)"
        )
    enforcement = available()
    registry = EnvRegistry(ctx.settings, ctx.pg_dsn)
    switch = last_switch(await registry.changes())
    previous = switch.came_from if switch is not None and switch.to == ctx.env else None
    hand_over(platform_root(ctx.settings, ctx.env).parent, ctx.env, previous)
    # resolved: a node's processes know their folder by the path they were started with
    root = platform_root(ctx.settings, ctx.env).resolve()
    root.mkdir(parents=True, exist_ok=True)
    access = await gateway_access(ctx.env, ctx.pg_dsn, root, conf.gateway_url)
    # The SDK's checkpoint helper keeps each job's file here unless the job says otherwise.
    access[CHECKPOINT_DIR_ENV] = str(root / "checkpoints")
    cluster = LocalCluster(
        root,
        runs_pods=True,
        base_env={**node_env(ctx.settings), **access},
        enforcement=enforcement,
        poll_s=conf.poll_s,
        slots=conf.slots,
    )
    log.warning(
        "local platform of env %s: jobs under %s; node memory limits by %s; %s",
        ctx.env,
        root,
        enforcement.value,
        "slots not counted" if conf.slots is None else f"{conf.slots} slots",
    )
    ctx.endpoints["local platform"] = f"{root} (memory limits: {enforcement.value})"
    demotion = RoleWatch(ctx.env, was_real=True)
    reconciler = EnvReconciler(
        ctx.settings,
        ctx.env,
        ctx.pg_dsn,
        # no write once another env is real: the jobs are the new real env's from then on
        FencedPlatform(cluster, demotion.holds),
        resync_s=conf.resync_seconds,
        on_step=on_step,
        metrics=OperatorMetrics(ctx.metrics, ctx.env, "local"),
        capacity=cluster if conf.slots is not None else None,
    )
    await cluster.start()
    store = await EnvStore.open(ctx.pg_dsn, ctx.env, max_size=2)
    api: web.AppRunner | None = None
    cluster.job_tokens = LocalJobTokens(Tokens(store.pool, ctx.env), root)
    try:
        async with (
            Producer(ctx.settings) as producer,
            background(demotion.follow(ctx.settings, ctx.stop), name=f"{ctx.env}.local.fence"),
        ):
            if conf.api_port is not None:
                app = jobs_app(
                    cluster,
                    Tokens(store.pool, ctx.env),
                    producer,
                    ctx.env,
                    (ANN_WORKDIR, os.getcwd()),
                )
                # the env's experiments beside its jobs, behind the same token
                app.add_subapp(
                    PREFIX,
                    experiments_app(
                        ExperimentStore(store.pool), Tokens(store.pool, ctx.env), producer, ctx.env
                    ),
                )
                # and its checkpoints and models (reads: a read token; register: admin)
                mount(app, CheckpointStore(store.pool), Tokens(store.pool, ctx.env))
                api = web.AppRunner(app, access_log=None)
                await api.setup()
                site = web.TCPSite(api, conf.api_host, conf.api_port)
                await site.start()
                port = api.addresses[0][1] if api.addresses else conf.api_port
                cluster.jobs_api = f"http://{conf.api_host}:{port}"
                ctx.endpoints["local jobs API"] = (
                    f"http://{conf.api_host}:{port}/v1/jobs  (admin token)"
                )
                ctx.endpoints["experiments API"] = (
                    f"http://{conf.api_host}:{port}{PREFIX}  (admin token)"
                )
                ctx.endpoints["checkpoints and models API"] = (
                    f"http://{conf.api_host}:{port}{CHECKPOINTS_PREFIX},"
                    f" {MODELS_PREFIX}  (read token; register: admin)"
                )
            inner = asyncio.Event()  # the reconciler's stop: ours, or the env's demotion
            running = asyncio.create_task(reconciler.run(inner), name=f"{ctx.env}.local")
            try:
                if await wait_for_any([reconciler.ready], [running]):
                    ctx.ready.set()
                await wait_for_any([ctx.stop, demotion.changed], [running])
                if demotion.changed.is_set() and not ctx.stop.is_set():
                    await cluster.stop(end_pods=False)  # no pod started from now on
                    if api is not None:  # nor a job submitted to it
                        await api.cleanup()
                        api = None
                    log.warning(
                        "env %s is no longer the real env (%s is): its local operator stops "
                        "touching the platform and leaves the jobs' processes running for "
                        "it",
                        ctx.env,
                        demotion.now_real,
                    )
            finally:
                inner.set()
                await running
            await ctx.stop.wait()
    finally:
        if api is not None:
            await api.cleanup()
        await store.close()
        still_real = None if demotion.changed.is_set() else await _still_real(registry, ctx.env)
        await cluster.stop(end_pods=ends_pods(conf.end_jobs_on_exit, still_real))


def ends_pods(end_jobs_on_exit: bool, still_real: bool | None) -> bool:
    """Whether a stopping operator ends its jobs' processes (pure): only a clean stop of
    the real env's operator, as configured. Once its env is demoted (or when the registry
    cannot say: None) they are the new real env's, adopted by its operator."""
    return end_jobs_on_exit and still_real is True


async def _still_real(registry: EnvRegistry, env: str) -> bool | None:
    try:
        record = await registry.get(env)
    except Exception as err:  # Postgres away as it stops: keep the processes
        log.warning("env %s: cannot read the registry as it stops (%s)", env, err)
        return None
    return record is not None and record.mode == EnvMode.REAL


async def _serve(ctx: ServiceContext) -> None:
    await run(ctx, {})


service = Service(
    name="local",
    description="the local platform: the real env's TrainingJobs as torchrun processes here",
    run=_serve,
)

__all__ = ["LocalSettings", "ends_pods", "node_env", "platform_root", "run", "service"]
