"""Where an env's real TrainingJobs run: the platform interface and its registry.

One reconciler (handlers.operator.reconcile.reconciler) applies ScalePlans, makes a job's
nodes match its spec and reports node and job events, on any platform that answers these
calls: jobs and their nodes ("pods") listed, read, created, patched, deleted and watched,
as JSON objects of the Kubernetes shape, and the Services an elastic job's nodes meet at
where the platform has no other place for them (Kubernetes; the local platform's nodes
meet at 127.0.0.1 and it has none). Kubernetes answers them with its API server
(``KubeApi``); the local platform with files and processes on this machine
(``LocalCluster``). The brain cannot tell them apart: both emit the same events and
results. The `job` commands use the same calls (submit, list, describe, delete; scale goes
through the env's scale.plans as the brain's plans do).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

from handlers.operator.kube.adapter import WorkloadAdapter


class Platform(Protocol):
    """The calls the reconciler and the `job` commands make of a platform."""

    adapter: WorkloadAdapter
    namespace: str
    #: where an elastic job's nodes find their rendezvous store (None: the platform's
    #: per-job default, a headless Service on Kubernetes)
    rendezvous_host: str | None

    async def list_jobs(self) -> tuple[list[dict[str, Any]], str]: ...
    async def get_job(self, name: str) -> dict[str, Any] | None: ...
    async def create_job(self, body: dict[str, Any]) -> dict[str, Any]: ...
    async def patch_job(self, name: str, body: dict[str, Any]) -> dict[str, Any]: ...
    async def patch_job_status(self, name: str, body: dict[str, Any]) -> dict[str, Any]: ...
    async def delete_job(self, name: str) -> bool: ...
    async def list_pods(self, selector: str | None = None) -> tuple[list[dict[str, Any]], str]: ...
    async def create_pod(self, manifest: dict[str, Any]) -> bool: ...
    async def delete_pod(self, name: str, grace_period_s: int | None = None) -> bool: ...
    async def list_services(self, selector: str) -> list[dict[str, Any]]: ...
    async def create_service(self, manifest: dict[str, Any]) -> bool: ...
    async def delete_service(self, name: str) -> bool: ...
    def watch(
        self, kind: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]: ...


class NotLeader(RuntimeError):
    """A write refused because this replica no longer holds the operator's lease: the
    plan it served is left to the leader (its delivery is not committed here)."""


class FencedPlatform:
    """A platform whose every write first asks ``may_act`` (the lease held, by this
    replica's clock) and raises NotLeader when not: a leader that lost its lease stops
    changing the cluster at once, even in the middle of a plan. Reads pass through."""

    def __init__(self, platform: Platform, may_act: Callable[[], bool]) -> None:
        self.platform = platform
        self.may_act = may_act
        self.adapter = platform.adapter
        self.namespace = platform.namespace
        self.rendezvous_host = platform.rendezvous_host

    def _check(self, what: str) -> None:
        if not self.may_act():
            raise NotLeader(f"not the leader any more: {what} refused")

    async def list_jobs(self) -> tuple[list[dict[str, Any]], str]:
        return await self.platform.list_jobs()

    async def get_job(self, name: str) -> dict[str, Any] | None:
        return await self.platform.get_job(name)

    async def create_job(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check("create job")
        return await self.platform.create_job(body)

    async def patch_job(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self._check(f"patch job {name}")
        return await self.platform.patch_job(name, body)

    async def patch_job_status(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self._check(f"patch status of job {name}")
        return await self.platform.patch_job_status(name, body)

    async def delete_job(self, name: str) -> bool:
        self._check(f"delete job {name}")
        return await self.platform.delete_job(name)

    async def list_pods(self, selector: str | None = None) -> tuple[list[dict[str, Any]], str]:
        return await self.platform.list_pods(selector)

    async def create_pod(self, manifest: dict[str, Any]) -> bool:
        self._check("create pod")
        return await self.platform.create_pod(manifest)

    async def delete_pod(self, name: str, grace_period_s: int | None = None) -> bool:
        self._check(f"delete pod {name}")
        return await self.platform.delete_pod(name, grace_period_s)

    async def list_services(self, selector: str) -> list[dict[str, Any]]:
        return await self.platform.list_services(selector)

    async def create_service(self, manifest: dict[str, Any]) -> bool:
        self._check("create service")
        return await self.platform.create_service(manifest)

    async def delete_service(self, name: str) -> bool:
        self._check(f"delete service {name}")
        return await self.platform.delete_service(name)

    def watch(
        self, kind: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        return self.platform.watch(kind, resource_version, timeout_s)


#: platform name -> "module:function" of its operator runner (ServiceContext, options).
#: Imported only once chosen: a process on the local platform never loads cluster
#: credentials, and a virtual env's operator imports neither.
PLATFORMS: Mapping[str, str] = {
    "kubernetes": "handlers.operator.kube.runner:run",
    "local": "handlers.operator.local.runner:run",
}
DEFAULT_PLATFORM = "kubernetes"


__all__ = ["DEFAULT_PLATFORM", "PLATFORMS", "FencedPlatform", "NotLeader", "Platform"]
