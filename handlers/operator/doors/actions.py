"""What is done to a platform's job by hand, one copy for every door: the `job` commands,
the operator's jobs API and the web console's actions all open the platform here and
scale or delete through these functions, so a job is found, refused and scaled the same
way whoever asks (the decisions themselves are handlers.operator.doors.jobs').

A scale never patches the job: it publishes a ScalePlan to the env's scale.plans, as
the brain's plans are, so the env's operator applies it once, records it and answers
with a ScaleResult.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

from dlrover_events.bus.producer import Producer
from dlrover_events.settings import Settings
from handlers.operator.doors.jobs import JobRequestError, resume_plan, scale_plan, suspend_plan
from handlers.operator.platform.api import Platform
from handlers.operator.platform.bodies import JobView, UnreadableJob
from handlers.operator.platform.registry import PLATFORMS
from schemas.plans import ScalePlan

#: The platforms a job can be acted on by hand (a virtual env's jobs are simulated).
JOB_PLATFORMS = tuple(PLATFORMS)

#: (settings, env, options) -> the platform's jobs, open for the block
JobsOpener = Callable[[Settings, str, Any], AbstractAsyncContextManager[Platform]]


class JobNotFound(JobRequestError):
    """No job of that name on the platform."""


class JobUnreadable(JobRequestError):
    """The platform holds the job, but not as a valid TrainingJob."""


@contextlib.asynccontextmanager
async def open_platform(
    settings: Settings,
    env: str,
    platform: str,
    *,
    kubeconfig: Path | None = None,
    namespace: str | None = None,
) -> AsyncIterator[Platform]:
    """The env's jobs where they run: the cluster (``kubeconfig``, else $KUBECONFIG,
    ~/.kube/config, else in-cluster, as kubectl), or the local platform's job objects of
    ``env``. The platform's module is imported on use (platform.PLATFORMS): a process on
    one platform never loads the other's. Each platform takes its own options
    (``PlatformEntry.options``): one it does not take, given, is a one-line error."""
    entry = PLATFORMS[platform]
    options = entry.options_of(kubeconfig=kubeconfig, namespace=namespace)
    opener: JobsOpener = entry.load(entry.jobs)
    async with opener(settings, env, options) as jobs:
        yield jobs


async def job_of(platform: Platform, name: str) -> JobView:
    job = await platform.get_job(name)
    if job is None:
        raise JobNotFound(f"no trainingjob {name!r} in namespace {platform.namespace}")
    if isinstance(job, UnreadableJob):
        raise JobUnreadable(f"trainingjob {name}: {job.reason}")
    return job


async def scale_job(
    platform: Platform,
    producer: Producer,
    env: str,
    name: str,
    role: str,
    replicas: int,
    *,
    source: str,
) -> ScalePlan:
    """Publish the plan that gives ``role`` of job ``name`` ``replicas`` nodes; its id is
    the request's on this version of the job, so a repeat before it applied is one plan."""
    plan = scale_plan(env, await job_of(platform, name), role, replicas, source=source)
    await producer.publish(plan)
    return plan


async def suspend_job(
    platform: Platform, producer: Producer, env: str, name: str, *, source: str
) -> ScalePlan:
    """Publish the plan that suspends job ``name``: its pods stop after their checkpoint
    (SIGTERM, then their grace period), the job and its progress are kept."""
    plan = suspend_plan(env, await job_of(platform, name), source=source)
    await producer.publish(plan)
    return plan


async def resume_job(
    platform: Platform, producer: Producer, env: str, name: str, *, source: str
) -> ScalePlan:
    """Publish the plan that resumes (or admits) the suspended job ``name`` at the size it
    had; its training goes on from its checkpoint."""
    plan = resume_plan(env, await job_of(platform, name), source=source)
    await producer.publish(plan)
    return plan


async def delete_job(platform: Platform, name: str) -> None:
    """Delete the job; the env's operator deletes its nodes."""
    if not await platform.delete_job(name):
        raise JobNotFound(f"no trainingjob {name!r}")


__all__ = [
    "JOB_PLATFORMS",
    "JobNotFound",
    "JobUnreadable",
    "JobsOpener",
    "delete_job",
    "job_of",
    "open_platform",
    "resume_job",
    "scale_job",
    "suspend_job",
]
