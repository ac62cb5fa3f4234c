"""What is done to a platform's job by hand, one copy for every door: the `job` commands,
the operator's jobs API and the web console's actions all open the platform here and
scale or delete through these functions, so a job is found, refused and scaled the same
way whoever asks (the decisions themselves are handlers.operator.jobs').

A scale never patches the job: it publishes a ScalePlan to the env's scale.plans, as
the brain's plans are, so the env's operator applies it once, records it and answers
with a ScaleResult.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from dlrover_events.bus.producer import Producer
from dlrover_events.errors import UserError
from dlrover_events.settings import Settings
from handlers.operator.jobs import JobRequestError, scale_plan
from handlers.operator.kube.trainingjob import TRAINING_JOB
from handlers.operator.platform import Platform
from handlers.operator.trainingjob import InvalidJob, JobView
from schemas.plans import ScalePlan

#: The platforms a job can be acted on by hand (a virtual env's jobs are simulated).
JOB_PLATFORMS = ("kubernetes", "local")


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
    ``env``."""
    if platform == "local":
        # imported on use: a process on one platform never loads the other's modules
        from handlers.operator.local.cluster import LocalCluster
        from handlers.operator.local.runner import platform_root

        yield LocalCluster(platform_root(settings, env), TRAINING_JOB)
        return
    if platform != "kubernetes":
        raise UserError(f"unknown platform {platform!r}; known: {', '.join(JOB_PLATFORMS)}")
    from handlers.operator.kube.client import KubeApi
    from handlers.operator.kube.runner import KubeSettings, connect

    api, ns = await connect(KubeSettings(kubeconfig=kubeconfig, namespace=namespace))
    async with api:
        yield KubeApi(api, TRAINING_JOB, ns)


async def job_of(platform: Platform, name: str) -> JobView:
    obj = await platform.get_job(name)
    if obj is None:
        raise JobNotFound(f"no trainingjob {name!r} in namespace {platform.namespace}")
    try:
        return TRAINING_JOB.parse(obj)
    except InvalidJob as e:
        raise JobUnreadable(f"trainingjob {name}: {e}") from None


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


async def delete_job(platform: Platform, name: str) -> None:
    """Delete the job; the env's operator deletes its nodes."""
    if not await platform.delete_job(name):
        raise JobNotFound(f"no trainingjob {name!r}")


__all__ = [
    "JOB_PLATFORMS",
    "JobNotFound",
    "JobUnreadable",
    "delete_job",
    "job_of",
    "open_platform",
    "scale_job",
]
