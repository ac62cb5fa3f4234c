"""A platform that acts only while its env's fence says this process may (the operator
that lost its lease or its env's real role stops writing at once, reads go on)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from handlers.operator.platform.api import JobEntry, Platform, WatchEvent, WatchKind
from handlers.operator.platform.bodies import (
    JobSpecChange,
    JobView,
    NewPod,
    OperatorJobStatus,
    PlanChange,
    PlatformCapabilities,
    PodView,
)
from handlers.operator.platform.errors import NotLeader
from schemas.plans import NotApplied, ScalePlan


class FencedPlatform:
    """A platform whose every write first asks ``may_act`` (the lease held, by this
    replica's clock) and raises NotLeader when not: a leader that lost its lease stops
    changing the cluster at once, even in the middle of a plan. Reads pass through."""

    def __init__(self, platform: Platform, may_act: Callable[[], bool]) -> None:
        self.platform = platform
        self.may_act = may_act
        self.name = platform.name
        self.namespace = platform.namespace
        self.creates_pods = platform.creates_pods

    @property
    def capabilities(self) -> PlatformCapabilities:
        return self.platform.capabilities

    def _check(self, what: str) -> None:
        if not self.may_act():
            raise NotLeader(f"not the leader any more: {what} refused")

    async def list_jobs(self) -> tuple[list[JobEntry], str]:
        return await self.platform.list_jobs()

    async def get_job(self, name: str) -> JobEntry | None:
        return await self.platform.get_job(name)

    async def submit_job(self, document: Mapping[str, Any]) -> JobView:
        self._check("submit job")
        return await self.platform.submit_job(document)

    async def change_job(self, job: JobView, change: JobSpecChange) -> JobView:
        self._check(f"change job {job.name}")
        return await self.platform.change_job(job, change)

    async def set_status(self, job: JobView, status: OperatorJobStatus) -> None:
        self._check(f"status of job {job.name}")
        await self.platform.set_status(job, status)

    async def delete_job(self, name: str) -> bool:
        self._check(f"delete job {name}")
        return await self.platform.delete_job(name)

    async def list_pods(self, job: str | None = None) -> tuple[list[PodView], str]:
        return await self.platform.list_pods(job)

    async def create_pod(self, job: JobView, pod: NewPod, env: str) -> bool:
        self._check(f"create pod {pod.name(job.name)}")
        return await self.platform.create_pod(job, pod, env)

    async def delete_pod(self, name: str, grace_s: int | None = None) -> bool:
        self._check(f"delete pod {name}")
        return await self.platform.delete_pod(name, grace_s)

    async def prepare(self, job: JobView) -> None:
        self._check(f"prepare job {job.name}")
        await self.platform.prepare(job)

    async def release(self, job: str) -> None:
        self._check(f"release job {job}")
        await self.platform.release(job)

    async def keep_spares(self, job: JobView, pods: Sequence[PodView], env: str) -> None:
        self._check(f"warm spares of job {job.name}")
        await self.platform.keep_spares(job, pods, env)

    def watch(
        self, kind: WatchKind, resource_version: str, timeout_s: int
    ) -> AsyncIterator[WatchEvent]:
        return self.platform.watch(kind, resource_version, timeout_s)

    def plan_change(self, job: JobView, pods: Sequence[PodView], plan: ScalePlan) -> PlanChange:
        return self.platform.plan_change(job, pods, plan)

    def not_applied(self, plan: ScalePlan) -> tuple[NotApplied, ...]:
        return self.platform.not_applied(plan)

    def outcome(self, job: JobView, pods: Sequence[PodView]) -> tuple[str | None, str]:
        return self.platform.outcome(job, pods)
