"""A plan's pods settling: a suspended job's pods gone, a resumed one's back, before the
plan is answered (the reconciler's wait, outside the job's lock, so that the reconcile loop
goes on meanwhile).

One role of the reconciler (handlers.operator.reconcile.reconciler), cut out as a
function of the port alone: it reads the job's pods from the platform until they are as
the plan wants them, or the time it gives them runs out, and says which.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from handlers.operator.platform.bodies import JobView, PodView
from handlers.operator.reconcile import planning
from schemas.plans import ScalePlan

#: Seconds past a suspended job's grace period (or a resumed job's first look) that a plan
#: waits for its pods to be gone (or back) before it is answered failed, with the pods
#: that were not.
SETTLE_MARGIN_S = 30.0
#: Seconds between two looks at a job's pods while a plan waits for them.
SETTLE_POLL_S = 0.2


@dataclass(frozen=True)
class Unsettled:
    """The pods did not come to what the plan wants in time: why, and the pods last seen."""

    reason: str
    pods: list[PodView]


async def settle(
    plan: ScalePlan,
    job: JobView,
    pods: list[PodView],
    pods_of: Callable[[str], Awaitable[list[PodView]]],
    *,
    margin_s: float = SETTLE_MARGIN_S,
) -> list[PodView] | Unsettled:
    """The job's pods once a suspend's are gone or a resume's are back (each created, as
    the platform says), looked at again with ``pods_of``; ``pods`` at once for a plan that
    neither suspends nor resumes. Unsettled, naming the pods, when they are not within
    the grace period and ``margin_s``."""
    suspending = plan.suspend and job.suspended
    admission = job.admission
    resuming = (
        not job.suspended
        and admission is not None
        and admission.plan_id == plan.plan_id
        and not admission.suspended
    )
    if not (suspending or resuming):
        return pods
    graces = [g for p in pods if (g := planning.grace_seconds(job, p)) is not None]
    budget = (max(graces) if suspending and graces else 0) + margin_s
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget
    while True:
        if suspending:
            left = planning.remaining(job, pods)
            if not left:
                return pods
            what = f"pods {', '.join(left)} still there"
        else:
            lacking = planning.missing(job, pods)
            if not lacking:
                return pods
            what = "no pod yet for " + ", ".join(
                f"{n} {role} replica{'s' if n > 1 else ''}" for role, n in lacking.items()
            )
        if loop.time() >= deadline:
            verb = "suspended" if suspending else "resumed"
            return Unsettled(f"job {job.name} is {verb}, but {budget:.0f} s later {what}", pods)
        await asyncio.sleep(SETTLE_POLL_S)
        pods = await pods_of(job.name)


__all__ = ["SETTLE_MARGIN_S", "SETTLE_POLL_S", "Unsettled", "settle"]
