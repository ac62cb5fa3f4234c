"""The real operator: the reconciler of whichever env is real, and of no other.

The env's mode is followed live on dlrover.control (EnvWatcher), not read once: when the
env is demoted, its reconciler is stopped (the operator stops touching the cluster, and
says so); when it is promoted again, or, with ``follow_real``, when any env is promoted,
a reconciler for that env starts, without a restart of the process.

This is the only operator module that loads cluster credentials (through
dlrover_events.kube.credentials, as the config gateway loads its own, read-only ones): a
kubeconfig (``kubeconfig`` option or DLROVER_EVENTS_OPERATOR_KUBECONFIG, then $KUBECONFIG
/ ~/.kube/config) or the pod's in-cluster service account. The virtual operator never
imports it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from dlrover_events.envs.bootstrap import TOKEN_SECRETS
from dlrover_events.envs.control import EnvWatcher
from dlrover_events.envs.tokens import Scope
from dlrover_events.errors import UserError
from dlrover_events.kube import credentials
from dlrover_events.lifecycle import (
    Beside,
    background,
    cancel_and_wait,
    wait_for_any,
    wait_or_stop,
)
from dlrover_events.runtime.metrics import OperatorMetrics
from dlrover_events.runtime.services import ServiceContext
from dlrover_events.settings import Settings
from handlers.operator.kube.adapters import adapter_for
from handlers.operator.kube.client import KubeApi
from handlers.operator.kube.cluster import KubeCluster
from handlers.operator.kube.experiments import ExperimentWatch
from handlers.operator.kube.lease import DEFAULT_LEASE_NAME, LeaseElector, Timing
from handlers.operator.kube.nodes import DEFAULT_GPU_RESOURCE
from handlers.operator.kube.trainingjob import DEFAULT_GPU_TYPE_LABEL
from handlers.operator.kube.wiring import pod_wiring
from handlers.operator.platform.api import Platform
from handlers.operator.platform.fencing import FencedPlatform
from handlers.operator.reconcile.reconciler import EnvReconciler, StepHook
from schemas.control import EnvAnnouncement, EnvMode

log = logging.getLogger(__name__)


class KubeSettings(BaseSettings):
    """The real operator's knobs (DLROVER_EVENTS_OPERATOR_*), options on top."""

    model_config = SettingsConfigDict(env_prefix="DLROVER_EVENTS_OPERATOR_", extra="ignore")

    kubeconfig: Path | None = Field(
        default=None, description="unset: $KUBECONFIG, ~/.kube/config, else in-cluster"
    )
    context: str | None = Field(default=None, description="kubeconfig context")
    namespace: str | None = Field(
        default=None,
        description="where the jobs live; unset: the context's, the pod's, else default",
    )
    follow_real: bool = Field(
        default=False, description="act for whichever env is real, switching on promotion"
    )
    workload: str = Field(default="TrainingJob", description="kind of the jobs (adapter)")
    gpu_type_label: str = Field(
        default=DEFAULT_GPU_TYPE_LABEL,
        description="node label whose value is a node's GPU type: a plan's GPU type "
        "becomes a node selector on it, and the capacity reports it; empty: GPU types are "
        "not applied (said so)",
    )
    gpu_resource: str = Field(
        default=DEFAULT_GPU_RESOURCE,
        min_length=1,
        description="the extended resource a Node's allocatable counts GPUs in (the "
        "capacity the operator reports on <env>.cluster.capacity)",
    )
    rendezvous_backend: Literal["c10d", "dlrover-c10d"] = Field(
        default="c10d",
        description="what elastic pods' torchrun agents rendezvous with (restart mode): "
        "dlrover-c10d, where the training images have the SDK, lets a node removed by a "
        "scale-down leave at once instead of the others waiting out its heartbeat",
    )
    node_selector: str | None = Field(
        default=None,
        description="label selector of the Nodes whose GPUs the env's jobs may use "
        "(e.g. pool=training); unset: every Node with GPUs",
    )
    report_capacity: bool = Field(
        default=True,
        description="watch Nodes and publish the cluster's capacity on "
        "<env>.cluster.capacity (needs the operator's nodes ClusterRole)",
    )
    resync_seconds: float = Field(
        default=30.0, gt=0, description="every job is reconciled at least this often"
    )
    watch_timeout_seconds: int = Field(
        default=60, ge=1, description="server-side timeout of each watch (then it resumes)"
    )
    experiments: bool = Field(
        default=True,
        description="watch the namespace's Experiment resources: submit each new one to "
        "the env's bus, kill a deleted one, write their status (needs the Experiment CRD "
        "of deploy/crds and the operator's Role)",
    )
    leader_elect: bool = Field(
        default=True,
        description="hold a coordination.k8s.io Lease so that of several replicas only "
        "one acts on the cluster; false: act at once (run one replica only)",
    )
    lease_name: str = Field(
        default=DEFAULT_LEASE_NAME, min_length=1, description="the Lease, in the jobs' namespace"
    )
    lease_duration_seconds: int = Field(
        default=15,
        ge=1,
        description="a lease unrenewed this long is taken over by another replica",
    )
    renew_deadline_seconds: float = Field(
        default=10.0,
        gt=0,
        description="a leader that could not renew for this long stops acting (< lease duration)",
    )
    retry_period_seconds: float = Field(
        default=2.0, gt=0, description="between tries to take or renew (< renew deadline)"
    )
    identity: str | None = Field(
        default=None,
        description="this replica in the Lease; unset: POD_NAME or host name, pid, random",
    )
    # What a TrainingJob's pods are told (handlers/operator/kube/wiring.py); Secrets are
    # named in the jobs' namespace, where a pod's references find them.
    gateway_url: str | None = Field(
        default=None,
        description="the gateway as training pods reach it (its Service: "
        "http://dlrover-events-gateway.<ns>.svc:8470); unset: pods get no gateway",
    )
    gateway_token_secret: str = Field(
        default=TOKEN_SECRETS[Scope.READ],
        min_length=1,
        description="Secret with each env's read token under the env's name (`bootstrap`)",
    )
    pod_bootstrap_servers: str | None = Field(
        default=None, description="Kafka as training pods reach it; unset: the operator's"
    )
    pod_sasl_username: str | None = Field(
        default=None, description="the pods' Kafka user; unset: the operator's"
    )
    pod_sasl_password_secret: str | None = Field(
        default=None, description="SECRET:KEY of the pods' Kafka password (SASL)"
    )
    pod_kafka_ca_secret: str | None = Field(
        default=None, description="Secret with the Kafka CA, mounted in pods (TLS)"
    )
    pod_kafka_cert_secret: str | None = Field(
        default=None, description="Secret with the pods' client certificate and key (mTLS)"
    )
    checkpoint_dir: str | None = Field(
        default=None,
        description="where the SDK's checkpoint helper keeps a job's checkpoints, as every "
        "pod reaches it (a shared volume's path or an fsspec URL such as s3://bucket/ckpt); "
        "unset: the job's own",
    )

    @model_validator(mode="after")
    def _timing(self) -> KubeSettings:
        self.lease_timing()  # the three durations must nest
        return self

    def lease_timing(self) -> Timing:
        return Timing(
            self.lease_duration_seconds, self.renew_deadline_seconds, self.retry_period_seconds
        )


REAL_OPTIONS = frozenset(KubeSettings.model_fields)


def kube_settings(options: Mapping[str, Any]) -> KubeSettings:
    unknown = sorted(set(options) - REAL_OPTIONS)
    if "slots" in unknown:
        raise UserError(
            "--slots is the local platform's (--platform local): a cluster's "
            "capacity is its Nodes' GPUs"
        )
    if unknown:
        raise UserError(
            f"option(s) {', '.join(unknown)} are for the virtual operator; the real env's "
            f"operator takes: {', '.join(sorted(REAL_OPTIONS))}"
        )
    try:
        return KubeSettings(**options)
    except ValidationError as e:
        first = e.errors()[0]
        where = f" {first['loc'][0]}" if first["loc"] else ""
        raise UserError(f"operator option{where}: {first['msg']}") from None


async def connect(conf: KubeSettings) -> tuple[client.ApiClient, str]:
    """An ApiClient with the cluster's credentials, and the namespace to work in."""
    return await credentials.connect(
        conf.kubeconfig,
        conf.context,
        conf.namespace,
        hint=(
            "give a kubeconfig: --kubeconfig (job commands), DLROVER_EVENTS_OPERATOR_KUBECONFIG"
            " (operator), DLROVER_EVENTS_CONSOLE_KUBECONFIG (console), or KUBECONFIG"
        ),
    )


class EnvMetrics(Collector):
    """The OperatorMetrics of each env an operator acted for, served as one collector of
    ``registry``: an operator that follows promotions acts for several envs in one
    process, and OperatorMetrics declares its families once per registry, so each env
    gets a registry of its own and a scrape sees one family per name, a series per env."""

    def __init__(self, registry: CollectorRegistry, platform: str) -> None:
        self.platform = platform
        self._envs: dict[str, tuple[CollectorRegistry, OperatorMetrics]] = {}
        registry.register(self)

    def of(self, env: str) -> OperatorMetrics:
        if env not in self._envs:
            own = CollectorRegistry()
            self._envs[env] = (own, OperatorMetrics(own, env, self.platform))
        return self._envs[env][1]

    def describe(self) -> list[Metric]:
        return []  # which envs come is known only as they do

    def collect(self) -> list[Metric]:
        families: dict[str, Metric] = {}
        for own, _ in self._envs.values():
            for family in own.collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                merged.samples.extend(family.samples)
        return list(families.values())


class RealOperator:
    """Runs an EnvReconciler for the env that should have the cluster now, only that one."""

    def __init__(
        self,
        settings: Settings,
        dsn: str,
        kube: KubeCluster,
        *,
        env: str | None,
        conf: KubeSettings | None = None,
        on_step: StepHook | None = None,
        retry_s: float = 5.0,
        leader: LeaseElector | None = None,
        metrics: CollectorRegistry | None = None,
    ) -> None:
        if env is None and not (conf and conf.follow_real):
            raise UserError("the real operator needs an env, or follow_real")
        self.settings = settings
        self.dsn = dsn
        self.kube = kube
        self.env = env
        self.conf = conf or KubeSettings()
        self.follow_real = env is None or self.conf.follow_real
        self.on_step = on_step
        self.retry_s = retry_s
        #: the env whose reconciler runs now, and that reconciler
        self.active: str | None = None
        self.current: EnvReconciler | None = None
        self._changed = asyncio.Event()
        self.metrics = EnvMetrics(metrics, "kubernetes") if metrics is not None else None
        #: the lease this replica must hold to act (None: no leader election)
        self.leader = leader
        if leader is not None:
            leader.subscribe(self._changed.set)

    def leads(self) -> bool:
        return self.leader is None or self.leader.held()

    def _platform(self) -> Platform:
        """The cluster, fenced by the lease: no write once it is lost."""
        if self.leader is None:
            return self.kube
        return FencedPlatform(self.kube, self.leader.held)

    def target(self, envs: Mapping[str, EnvAnnouncement]) -> str | None:
        """The env to act for: the real one (follow_real), or ours while it is real."""
        reals = sorted(n for n, a in envs.items() if a.mode == EnvMode.REAL)
        real = reals[0] if len(reals) == 1 else None
        if self.follow_real:
            return real
        return self.env if real == self.env else None

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        watcher = EnvWatcher(self.settings, on_change=lambda _: self._changed.set())
        async with background(watcher.run(stop), name="operator.control") as control:
            await self._act(watcher, control, stop, ready)

    async def _act(
        self,
        watcher: EnvWatcher,
        control: Beside,
        stop: asyncio.Event,
        ready: asyncio.Event | None,
    ) -> None:
        """Run the reconciler of the env to act for, kept across turns (a new one when the
        env changes, again after a backoff when it failed), until ``stop``. The control
        watch (``control``) failing is raised at once."""
        task: asyncio.Task[None] | None = None
        inner_stop = asyncio.Event()
        try:
            await wait_for_any([watcher.caught_up], control)
            control.raise_failure()
            if ready is not None:
                ready.set()
            while not stop.is_set():
                self._changed.clear()
                leads = self.leads()
                want = self.target(watcher.envs) if leads else None
                if task is not None and task.done():
                    failed = not task.cancelled() and task.exception() is not None
                    if failed:
                        log.error(
                            "operator of env %s stopped: %r; starting again in %.0f s",
                            self.active,
                            task.exception(),
                            self.retry_s,
                        )
                        await wait_or_stop(stop, self.retry_s, control)
                        control.raise_failure()
                    task, self.active, self.current = None, None, None
                if want != self.active:
                    if task is not None:
                        await self._stop(task, inner_stop, watcher.envs, lost=not leads)
                        task, self.current = None, None
                    self.active = want
                    if want is None:
                        if leads:  # else the lease says who acts, and the elector said it
                            log.warning(
                                "no env is real for this operator now%s: it leaves the "
                                "cluster alone",
                                "" if self.follow_real else f" ({self.env} is not real)",
                            )
                    else:
                        inner_stop = asyncio.Event()
                        self.current = EnvReconciler(
                            self.settings,
                            want,
                            self.dsn,
                            self._platform(),
                            resync_s=self.conf.resync_seconds,
                            watch_timeout_s=self.conf.watch_timeout_seconds,
                            on_step=self.on_step,
                            metrics=self.metrics.of(want) if self.metrics is not None else None,
                            capacity=self.kube if self.conf.report_capacity else None,
                        )
                        task = asyncio.create_task(
                            self._run_env(want, self.current, inner_stop),
                            name=f"{want}.operator.real",
                        )
                        log.warning(
                            "env %s is the real env: the operator acts on namespace %s for it",
                            want,
                            self.kube.namespace,
                        )
                await wait_for_any([self._changed, stop], [*control, *([task] if task else [])])
                control.raise_failure()
        finally:
            if task is not None:
                await self._stop(task, inner_stop, watcher.envs, why="the operator stops")

    async def _run_env(self, env: str, reconciler: EnvReconciler, stop: asyncio.Event) -> None:
        """The env's reconciler and, beside it under the same lease, the Experiments of
        the namespace (experiments.py); either failing ends both."""
        if not self.conf.experiments:
            await reconciler.run(stop)
            return
        watch = ExperimentWatch(
            self.settings,
            env,
            self.kube.api.api,
            self.kube.namespace,
            may_act=self.leads,
            watch_timeout_s=self.conf.watch_timeout_seconds,
        )
        async with asyncio.TaskGroup() as both:
            both.create_task(reconciler.run(stop), name=f"{env}.operator.reconciler")
            both.create_task(watch.run(stop), name=f"{env}.operator.experiments")

    async def _stop(
        self,
        task: asyncio.Task[None],
        stop: asyncio.Event,
        envs: Mapping[str, EnvAnnouncement],
        *,
        lost: bool = False,
        why: str | None = None,
    ) -> None:
        env = self.active
        stop.set()
        await cancel_and_wait(task)
        if lost:
            why = "this replica lost the operator's lease"
        if why is not None:
            log.warning("env %s: %s; it stopped touching the cluster", env, why)
            return
        announced = envs.get(env or "")
        now = "gone" if announced is None else f"now {announced.mode.value}"
        log.warning(
            "env %s is no longer the real env (%s): the operator stops touching the cluster for it",
            env,
            now,
        )


async def run(ctx: ServiceContext, options: Mapping[str, Any]) -> None:
    """Entry of the mode dispatch (modes.run_operator) for the real env, or any env with
    follow_real."""
    conf = kube_settings(options)
    wiring = pod_wiring(
        ctx.settings,
        bootstrap_servers=conf.pod_bootstrap_servers,
        gateway_url=conf.gateway_url,
        token_secret=conf.gateway_token_secret,
        sasl_username=conf.pod_sasl_username,
        sasl_password_secret=conf.pod_sasl_password_secret,
        ca_secret=conf.pod_kafka_ca_secret,
        cert_secret=conf.pod_kafka_cert_secret,
        checkpoint_dir=conf.checkpoint_dir,
    )
    for warning in wiring.warnings:
        log.warning("%s", warning)
    adapter = adapter_for(conf.workload).configured(
        gpu_type_label=conf.gpu_type_label or None,
        wiring=wiring,
        rendezvous_backend=conf.rendezvous_backend,
    )
    api, namespace = await connect(conf)
    async with api:
        kube = KubeCluster(
            KubeApi(api, adapter, namespace),
            gpu_resource=conf.gpu_resource,
            gpu_type_label=conf.gpu_type_label or None,
            node_selector=conf.node_selector,
        )
        leader = None
        if conf.leader_elect:
            leader = LeaseElector(
                api,
                namespace,
                name=conf.lease_name,
                identity=conf.identity,
                timing=conf.lease_timing(),
            )
        operator = RealOperator(
            ctx.settings,
            ctx.pg_dsn,
            kube,
            env=None if conf.follow_real else ctx.env,
            conf=conf,
            leader=leader,
            metrics=ctx.metrics,
        )
        await run_elected(operator, leader, ctx.stop, ctx.ready)


async def run_elected(
    operator: RealOperator,
    leader: LeaseElector | None,
    stop: asyncio.Event,
    ready: asyncio.Event | None = None,
) -> None:
    """The operator, acting only while ``leader`` holds the lease (None: at once). The
    lease is released only after the operator has stopped acting."""
    if leader is None:
        await operator.run(stop, ready)
        return
    campaign_stop = asyncio.Event()
    async with background(leader.run(campaign_stop), name="operator.lease") as (campaign,):
        try:
            await operator.run(stop, ready)
        finally:
            campaign_stop.set()
            await campaign  # its release, after the operator stopped acting


__all__ = [
    "REAL_OPTIONS",
    "EnvMetrics",
    "KubeSettings",
    "RealOperator",
    "connect",
    "kube_settings",
    "run",
    "run_elected",
]
