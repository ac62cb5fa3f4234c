"""tiresias: the Pollux artifact's Tiresias baseline as a brain scheduler.

A second cluster-wide policy lets the virtual env compare goodput-cluster with the
baseline the Pollux paper compares against, run by the same brain on the same jobs. It is
two-queue discretised least-attained-service (Tiresias, NSDI'19) as the OSDI'21 artifact
configures it: one threshold of 16 GPU-hours, starvation promotion off. It never resizes a
job and never touches its batch: a job runs the replicas it asked for, or not at all.

A registered scheduler is a pure function of one tick's inputs, with no state kept
between ticks, so the queues are derived from those inputs every time:

- queue 0 holds the arrived jobs whose attained service (GPU-seconds held) is below the
  threshold, in arrival order, ties by job id;
- queue 1 holds the others, in the order they crossed the threshold. The artifact keeps
  that order as a list, which a function of this tick's inputs cannot; here a job's place
  is the earliest time it could have crossed, had it run at its requested size from its
  arrival on, ``submitted_at + threshold / requested_replicas`` (ties by arrival, then
  job id). That key never moves, so a job suspended in queue 1 keeps its place, as in the
  artifact; the order differs from the artifact's only where a job that waited in queue 0
  crossed after one whose earliest time is later. In the artifact's loop over its eight
  main workloads it gives every job the artifact's JCT (workload-1 aside, by 0.07 %: a
  placement listed in node order, not in the order its GPUs were taken, costs slightly
  different step times), where the time it would have crossed had it run since,
  ``now - (attained - threshold) / replicas``, moved a suspended job behind running ones
  and the mean JCT by up to 5 %;
- the queues are walked in order, 0 then 1, and every job whose whole gang still fits by
  GPU count runs (smaller jobs go past a gang that does not fit); the rest hold nothing: a
  running one is suspended, a waiting one keeps waiting;
- a job that keeps running keeps its GPUs; one that starts takes them as the artifact
  does, from the node with the most free GPUs first (first node on ties), as many as that
  node has left, then the next; its placement is listed in node order.

Beyond the artifact: jobs are walked by priority first (higher first), the two queues
within each priority; before the walk, each quota's jobs (`sharing.guarantee`: in the
walk's order, while the quota has room for their gang) run, so a borrower gives the GPUs
back in the round after an owner asks; Kueue's jobs are not walked (what a running one
holds is set aside, untouched; a waiting one waits for Kueue); a job of a GPU type runs
only on nodes of that type; a running job that is not preemptible keeps its GPUs before
the walk;
a running job whose placement no longer exists, overfills a node or is not its requested
size is placed again (a move). Only jobs submitted at or before `now` exist. The same
inputs give the same schedule whatever their order.

The schedule's `objective` is the share of the cluster's GPUs held after the tick
(`objective_before`: before it), and an allocation's `speedup` is 1 when the job runs and
0 when it does not: Tiresias reads neither the goodput model nor the speedups.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import Field

from schemas.envelope import Model
from streams.brain.core.schedulers.api import (
    ChangeKind,
    ClusterCapacity,
    JobChange,
    JobHolding,
    JobInput,
    Placement,
    Schedule,
    change_order,
    check_jobs,
)
from streams.brain.core.schedulers.sharing import guarantee, set_aside

#: The artifact's one queue threshold: 16 GPU-hours of service demote a job to queue 1.
QUEUE_THRESHOLD_GPU_S = 3600.0 * 16


class TiresiasParams(Model):
    queue_threshold_gpu_s: float = Field(
        default=QUEUE_THRESHOLD_GPU_S,
        ge=0,
        description="GPU-seconds of attained service that move a job to the second queue",
    )


@dataclass(frozen=True, slots=True)
class Queued:
    """A job's place in the walk: its queue and the key it is ordered by within it."""

    job: JobInput
    queue: int
    #: queue 0: arrival time; queue 1: the earliest time it could have crossed the threshold
    since: float

    @property
    def key(self) -> tuple[int, int, float, float, str]:
        return (-self.job.priority, self.queue, self.since, self.job.submitted_at, self.job.job_id)


def queue_order(now: float, jobs: Sequence[JobInput], threshold_gpu_s: float) -> list[Queued]:
    """The arrived jobs in the order Tiresias considers them: by priority, higher first,
    then as the module docstring says."""
    out = []
    for job in jobs:
        if job.submitted_at > now:
            continue
        if job.attained_gpu_s < threshold_gpu_s:
            out.append(Queued(job, 0, job.submitted_at))
        else:
            earliest = job.submitted_at + threshold_gpu_s / job.requested_replicas
            out.append(Queued(job, 1, earliest))
    out.sort(key=lambda q: q.key)
    return out


def _kept_placements(running: Sequence[JobInput], cluster: ClusterCapacity) -> dict[str, Placement]:
    """The running jobs that keep their GPUs: a placement on known nodes, at the requested
    size, on no node that the kept jobs together overfill."""
    capacity = {n.name: n.gpus for n in cluster.nodes}
    types = {n.name: n.gpu_type for n in cluster.nodes}
    ok = []
    for job in running:
        names = [name for name, _ in job.placement]
        if (
            job.placement
            and len(set(names)) == len(names)
            and all(name in capacity and g >= 1 for name, g in job.placement)
            and job.replicas == job.requested_replicas
            and (job.gpu_type is None or all(types[name] == job.gpu_type for name in names))
        ):
            ok.append(job)
    used: dict[str, int] = {}
    for job in ok:
        for name, g in job.placement:
            used[name] = used.get(name, 0) + g
    over = {name for name, g in used.items() if g > capacity[name]}
    return {
        job.job_id: job.placement
        for job in ok
        if not any(name in over for name, _ in job.placement)
    }


def _place(
    count: int, free: dict[str, int], index: Mapping[str, int], among: Iterable[str] | None = None
) -> Placement | None:
    """`count` GPUs, each run from the node with the most free ones (first node on ties),
    of the nodes `among` (None: all), listed in node order; None when fewer are free."""
    pool = list(free) if among is None else [name for name in among if name in free]
    if sum(free[name] for name in pool) < count:
        return None
    taken: dict[str, int] = {}
    left = count
    while left > 0:
        node = min(pool, key=lambda name: (-free[name], index[name]))
        take = min(free[node], left)
        taken[node] = take
        free[node] -= take
        left -= take
    return tuple(sorted(taken.items(), key=lambda item: index[item[0]]))


def _nodes_text(placement: Placement) -> str:
    return "+".join(f"{name}:{g}" for name, g in placement) or "none"


def _where(q: Queued, threshold_gpu_s: float) -> str:
    hours = q.job.attained_gpu_s / 3600
    return f"queue {q.queue} ({hours:.3g} GPU-h attained, threshold {threshold_gpu_s / 3600:.3g})"


def tiresias(
    now: float,
    cluster: ClusterCapacity,
    jobs: Sequence[JobInput],
    params: TiresiasParams | None = None,
) -> Schedule:
    """The tick's allocation, as the changes to make (see the module docstring)."""
    p = params or TiresiasParams()
    check_jobs(jobs)
    order = queue_order(now, jobs, p.queue_threshold_gpu_s)
    if not order:
        return Schedule((), (), 0.0, 0.0)
    # Kueue's jobs are Kueue's: what its running ones hold is set aside, untouched
    open_cluster, kueue_held = set_aside(cluster, [q.job for q in order])
    walk = [q for q in order if not q.job.kueue_managed]
    total = cluster.total_gpus
    index = {n.name: i for i, n in enumerate(open_cluster.nodes)}
    typed: dict[str, list[str]] = {}
    for n in open_cluster.nodes:
        if n.gpu_type is not None:
            typed.setdefault(n.gpu_type, []).append(n.name)

    current = _kept_placements([q.job for q in walk if q.job.placement], open_cluster)
    free_gpus = open_cluster.total_gpus
    free_typed = {
        kind: sum(n.gpus for n in open_cluster.nodes if n.gpu_type == kind) for kind in typed
    }
    runs: set[str] = set()

    def fits(job: JobInput) -> bool:
        r = job.requested_replicas
        return r <= free_gpus and (job.gpu_type is None or r <= free_typed.get(job.gpu_type, 0))

    def run(job: JobInput) -> None:
        nonlocal free_gpus
        runs.add(job.job_id)
        free_gpus -= job.requested_replicas
        if job.gpu_type is not None:
            free_typed[job.gpu_type] -= job.requested_replicas

    # a running job that may not be preempted keeps its GPUs whatever its queue
    for q in walk:
        if not q.job.preemptible and q.job.job_id in current:
            run(q.job)
    # each group's quota: its jobs first, in the walk's order, while it has room
    floors = guarantee(
        [q.job for q in walk],
        {q.job.job_id: q.job.requested_replicas for q in walk},
        {k: q.job.requested_replicas for q in walk if (k := q.job.job_id) in runs},
        cluster.guaranteed(sum(g for held in kueue_held.values() for g in held.values())),
    )
    for q in walk:
        if q.job.job_id in floors and q.job.job_id not in runs and fits(q.job):
            run(q.job)
    for q in walk:
        if q.job.job_id not in runs and fits(q.job):
            run(q.job)

    kept = {k: v for k, v in current.items() if k in runs}
    free = {n.name: n.gpus for n in open_cluster.nodes}
    for placement in kept.values():
        for name, g in placement:
            free[name] -= g
    placed: dict[str, Placement] = dict(kept)
    # the jobs of a GPU type first: the others may run anywhere
    for q in sorted(walk, key=lambda q: q.job.gpu_type is None):
        key = q.job.job_id
        if key in runs and key not in placed:
            among = None if q.job.gpu_type is None else typed.get(q.job.gpu_type, [])
            got = _place(q.job.requested_replicas, free, index, among)
            if got is None:
                runs.discard(key)  # (its type's GPUs are held by jobs kept where they run)
            else:
                placed[key] = got
    for key, held in kueue_held.items():
        placed[key] = tuple(sorted(held.items(), key=lambda item: index.get(item[0], 0)))
        runs.add(key)

    decisions: list[JobChange] = []
    for q in order:
        job = q.job
        key = job.job_id
        where = _where(q, p.queue_threshold_gpu_s)
        if key in kept or job.kueue_managed:
            continue
        if key not in runs:
            if job.placement:
                decisions.append(
                    JobChange(
                        key,
                        ChangeKind.SUSPEND,
                        0,
                        (),
                        None,
                        None,
                        None,
                        True,
                        f"{where}: its {job.requested_replicas} GPU(s) go to jobs ahead of it",
                    )
                )
            continue
        placement = placed[key]
        r = job.requested_replicas
        if not job.placement:
            kind = ChangeKind.ADMIT
        elif r < job.replicas:
            kind = ChangeKind.SHRINK
        elif r > job.replicas:
            kind = ChangeKind.GROW
        else:
            kind = ChangeKind.MOVE
        decisions.append(
            JobChange(
                key,
                kind,
                r,
                placement,
                None,
                None,
                None,
                True,
                f"{where}: {job.replicas} -> {r} GPU(s) on {_nodes_text(placement)}",
            )
        )
    decisions.sort(key=change_order)

    allocations = tuple(
        JobHolding(
            q.job.job_id,
            sum(g for _, g in placed.get(q.job.job_id, ())) if q.job.job_id in runs else 0,
            placed.get(q.job.job_id, ()),
            None,
            1.0 if q.job.job_id in runs else 0.0,
        )
        for q in sorted(order, key=lambda q: q.job.job_id)
    )
    held_before = sum(q.job.replicas for q in order)
    held_after = sum(a.replicas for a in allocations)
    return Schedule(
        tuple(decisions),
        allocations,
        held_after / total if total else 0.0,
        held_before / total if total else 0.0,
    )


__all__ = ["QUEUE_THRESHOLD_GPU_S", "Queued", "TiresiasParams", "queue_order", "tiresias"]
