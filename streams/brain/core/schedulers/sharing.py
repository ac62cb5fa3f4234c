"""How a shared cluster is divided before a scheduler optimises: Kueue's jobs, quotas.

Every scheduler answers three questions the same way, so they are answered here once:

- **Kueue's jobs.** A job Kueue manages (`JobInput.kueue_managed`) is admitted and
  suspended by Kueue alone; a second admitter would fight it. A scheduler never admits
  or suspends one: what such a job holds is set aside (`set_aside`), the rest of the
  cluster is what the scheduler hands out (`ClusterCapacity` less those GPUs), and the
  job may only be resized within its own GPUs.
- **Quotas.** A group's quota (`ClusterCapacity.quotas`) is guaranteed: each round,
  before anyone borrows, the group's jobs are given their smallest size in the group's
  order (higher priority first) while the quota has room (`guarantee`). A borrower
  holding the GPUs a quota's owner asks for loses them in the very next round: a
  guaranteed job is a floor every search starts from.
- **Priority.** Among the jobs beyond their quota, a job is admitted before any job of
  lower priority; each scheduler keeps that order in its own search.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from streams.brain.core.schedulers.api import ClusterCapacity, JobInput, NodeCapacity


def set_aside(
    capacity: ClusterCapacity, jobs: Iterable[JobInput]
) -> tuple[ClusterCapacity, dict[str, dict[str, int]]]:
    """The capacity left once running Kueue-managed jobs keep what they hold, and what
    each of them holds on nodes the capacity knows (at most a node's GPUs, in total)."""
    gpus = {n.name: n.gpus for n in capacity.nodes}
    held: dict[str, dict[str, int]] = {}
    for job in sorted(jobs, key=lambda j: j.job_id):
        if not job.kueue_managed or not job.placement:
            continue
        mine: dict[str, int] = {}
        for name, g in job.placement:
            take = min(g, gpus.get(name, 0))
            if take > 0:
                mine[name] = mine.get(name, 0) + take
                gpus[name] -= take
        held[job.job_id] = mine
    if not held:
        return capacity, held
    left = tuple(NodeCapacity(n.name, gpus[n.name], n.gpu_type) for n in capacity.nodes)
    return replace(capacity, nodes=left), held


def guarantee(
    order: Sequence[JobInput],
    need: Mapping[str, int],
    held: Mapping[str, int],
    quotas: Mapping[str, int],
) -> dict[str, int]:
    """The jobs each quota guarantees this round and the GPUs it guarantees them: the
    group's jobs in `order` (the caller's: priority first) are given `need` (their
    smallest size) while the quota, less what the group's jobs in `held` keep anyway
    (jobs no scheduler may move), has room for it; a job that does not fit is passed
    over for smaller ones after it."""
    room = dict(quotas)
    for job in order:
        if job.group in room and job.job_id in held:
            room[job.group] -= held[job.job_id]
    out: dict[str, int] = {}
    for job in order:
        if job.group not in room or job.job_id in held:
            continue
        size = need.get(job.job_id, 0)
        if 0 < size <= room[job.group]:
            out[job.job_id] = size
            room[job.group] -= size
    return out


__all__ = ["guarantee", "set_aside"]
