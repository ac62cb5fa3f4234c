"""What the reconciler's tests share (no tests here): a kubelet loop, the operator, helpers.

Real parts only: the kube-apiserver of the `kube` fixture, the session's broker and
Postgres. Waiting is bounded by generous deadlines; no assertion depends on how long
anything took.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from dlrover_events.settings import Settings
from handlers.operator.kube.client import KubeApi
from handlers.operator.kube.cluster import KubeCluster
from handlers.operator.kube.trainingjob import TRAINING_JOB
from handlers.operator.platform.bodies import JobView, PodView
from handlers.operator.reconcile.events import job_meta
from handlers.operator.reconcile.reconciler import EnvReconciler, StepHook
from schemas.jobs import JobMeta
from schemas.plans import ScalePlan

from .kube import GROUP, PLURAL, VERSION, FakeKubelet, unique_name

T = TypeVar("T")
DEADLINE_S = 120.0


async def until(found: Callable[[], Awaitable[T | None]], what: str) -> T:
    """Wait for ``found()`` to give something truthy; fail naming ``what`` at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    last: Any = None
    while loop.time() < deadline:
        last = await found()
        if last:
            return last
        await asyncio.sleep(0.1)
    pytest.fail(f"no {what} within {DEADLINE_S:.0f}s (last seen: {last!r})")


def role(replicas: int, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": replicas,
        "minReplicas": 0,
        "maxReplicas": 8,
        "resources": {"cpu": 2, "memory": "4Gi"},
        "restartPolicy": "Never",
        "template": {
            "metadata": {"labels": {"team": "vision"}},
            "spec": {"containers": [{"name": "main", "image": "train:1.0"}]},
        },
    }
    spec.update(overrides)
    return spec


@dataclass
class KubeletLoop:
    """Plays the kubelet (and scheduler) of the fake node for every pod of a namespace:
    binds new pods and starts them (unless held), and confirms deletions, as a kubelet
    does when the containers have stopped."""

    kubelet: FakeKubelet
    namespace: str
    hold: set[str] = field(default_factory=set)
    #: pods whose deletion is not confirmed while named here (their containers "still
    #: stopping"): they stay, being deleted
    hold_deletion: set[str] = field(default_factory=set)
    #: pod -> the grace period its deletion asked for (metadata.deletionGracePeriodSeconds)
    graces: dict[str, int | None] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        core = self.kubelet.core
        while True:
            pods = (await core.list_namespaced_pod(self.namespace)).items
            for pod in pods:
                name = pod.metadata.name
                with contextlib.suppress(ApiException):  # gone meanwhile
                    if pod.metadata.deletion_timestamp is not None:
                        self.graces[name] = pod.metadata.deletion_grace_period_seconds
                        if name not in self.hold_deletion:
                            await self.kubelet.force_delete(self.namespace, name)
                    elif pod.spec.node_name is None:
                        await self.kubelet.bind(self.namespace, name)
                    elif pod.status.phase == "Pending" and name not in self.hold:
                        await self.kubelet.running(self.namespace, name)
            await asyncio.sleep(0.1)


@dataclass
class Operator:
    reconciler: EnvReconciler
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def halt(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, DEADLINE_S)

    async def kill(self) -> None:
        """As abrupt as a process can be stopped from inside: no orderly end of the plan."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@dataclass
class Cluster:
    settings: Settings
    pg_dsn: str
    api: client.ApiClient
    namespace: str
    #: the API as the tests read and write it (JSON); the reconciler gets it as the
    #: platform port (KubeCluster)
    kube: KubeApi = field(init=False)
    running: list[Operator] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kube = KubeApi(self.api, TRAINING_JOB, self.namespace)

    async def start(
        self,
        env: str,
        on_step: StepHook | None = None,
        *,
        platform: KubeCluster | None = None,
        capacity: bool = False,
    ) -> Operator:
        """A reconciler of ``env`` on this namespace (``platform``: the cluster as given,
        e.g. with a node selector; ``capacity``: it reports the cluster's capacity too)."""
        kube = platform or KubeCluster(self.kube)
        reconciler = EnvReconciler(
            self.settings,
            env,
            self.pg_dsn,
            kube,
            resync_s=2.0,
            watch_timeout_s=20,
            retry_s=0.5,
            on_step=on_step,
            capacity=kube if capacity else None,
        )
        stop = asyncio.Event()
        task = asyncio.create_task(reconciler.run(stop))
        ready = asyncio.create_task(reconciler.ready.wait())
        await asyncio.wait([task, ready], timeout=DEADLINE_S, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            if task.done():
                task.result()
            pytest.fail(f"the reconciler of {env} was not ready within {DEADLINE_S:.0f}s")
        op = Operator(reconciler, stop, task)
        self.running.append(op)
        return op

    async def create_job(self, roles: dict[str, Any], name: str | None = None) -> str:
        name = name or unique_name("job")
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TrainingJob",
            "metadata": {"name": name, "labels": {"dlrover-events.io/app": "resnet"}},
            "spec": {"roles": roles},
        }
        await client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, body
        )
        return name

    async def job(self, name: str) -> JobView | None:
        obj = await self.kube.get_job(name)
        return TRAINING_JOB.parse(obj) if obj is not None else None

    async def meta(self, name: str) -> JobMeta:
        job = await self.job(name)
        assert job is not None, name
        return job_meta(job)

    async def pods(self, job: str, *, role: str | None = None) -> list[PodView]:
        """The job's pods that are not being deleted, by role and rank."""
        items, _ = await self.kube.list_pods(f"dlrover-events.io/job={job}")
        pods = [p for p in map(TRAINING_JOB.parse_pod, items) if p is not None]
        return sorted(
            (p for p in pods if not p.deleting and (role is None or p.role == role)),
            key=lambda p: (p.role, p.rank, p.index),
        )

    async def all_pods(self, job: str) -> list[PodView]:
        items, _ = await self.kube.list_pods(f"dlrover-events.io/job={job}")
        return [p for p in map(TRAINING_JOB.parse_pod, items) if p is not None]

    async def raw_pod(self, name: str) -> Any:
        return await client.CoreV1Api(self.api).read_namespaced_pod(name, self.namespace)

    async def workers_running(self, job: str, n: int) -> list[PodView] | None:
        pods = await self.pods(job, role="worker")
        ok = len(pods) == n and all(p.running for p in pods)
        return pods if ok else None

    def plan(self, env: str, meta: JobMeta, plan_id: str, **fields: Any) -> ScalePlan:
        return ScalePlan(env=env, job=meta, source="test", plan_id=plan_id, **fields)


__all__ = ["DEADLINE_S", "Cluster", "KubeletLoop", "Operator", "role", "until"]
