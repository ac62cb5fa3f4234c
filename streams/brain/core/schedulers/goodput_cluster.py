"""goodput-cluster: one allocation of the env's GPUs across all its arrived jobs per tick.

Per-job optimizers each see one job and so cannot trade one job's GPUs for another's; a
cluster with more demand than GPUs needs that trade (who to admit, who to shrink or
suspend). This allocator maximises Pollux's objective, the p = -1 power mean of every
arrived job's speedup over a fair share, with a cheap deterministic search instead of
Pollux's genetic algorithm:

1. per job, its best batch and speedup at every size the whole-node rule allows
   (1..GPUs-per-node on one node, or whole nodes);
2. greedy marginal goodput: repeatedly give the job whose objective term gains the most
   per extra GPU its next size worth more than its current one (skipping sizes worth
   less, e.g. below the size it holds and would keep without a restart), as long as the
   sizes still pack onto the nodes;
   run once from nothing (so preemption and shrinking are possible) and once from the
   current allocation (only growing into free GPUs); keep the better, or the current
   allocation when neither beats it;
3. a running job that changes its allocation has its speedup multiplied by Pollux's
   restart factor and divided by (1 + hysteresis): it moves only for a real gain; a batch
   change without a placement change costs no restart and is made only when it gains
   more than the hysteresis.

Only jobs submitted at or before `now` exist for the decision. The same inputs give the
same decisions, whatever their order: jobs are ordered by id and every tie is broken by
job id, then by size, then by node order.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import Field

from schemas.envelope import Model
from schemas.plans import RescaleMode
from schemas.rescale_cost import rescale_cost_s
from streams.brain.core.schedulers.api import (
    ChangeKind,
    ClusterCapacity,
    JobChange,
    JobHolding,
    JobInput,
    JobInputError,
    NodeCapacity,
    Placement,
    Schedule,
    change_order,
    check_jobs,
)
from streams.brain.core.schedulers.goodput import Grids
from streams.brain.core.schedulers.packing import PackedJob, Packer
from streams.brain.core.schedulers.speedup import (
    SizeMenu,
    SpeedupTable,
    fair_share,
    power_mean,
    restart_factor,
    shapes,
    speedup_table,
    utility,
)


class GoodputClusterParams(Model):
    fairness_p: float = Field(
        default=-1.0, ge=-10, le=1, description="power-mean exponent: -1 Pollux, 1 sum"
    )
    rescale_mode: RescaleMode = Field(
        default=RescaleMode.RESTART,
        description="how the jobs take a new allocation: restart or in_place; the restart "
        "penalty's seconds are its figure in schemas/rescale_cost.py",
    )
    restart_cost_s: float | None = Field(
        default=None,
        ge=0,
        description="seconds a job loses when its allocation changes (default: the "
        "rescale mode's figure in schemas/rescale_cost.py)",
    )

    @property
    def rescale_cost_s(self) -> float:
        """The seconds the restart penalty charges a change of allocation."""
        if self.restart_cost_s is not None:
            return self.restart_cost_s
        return rescale_cost_s(self.rescale_mode)

    hysteresis: float = Field(
        default=0.05, ge=0, le=10, description="relative gain a running job needs to change"
    )
    epsilon: float = Field(
        default=1e-3, gt=0, le=1, description="added to each scaled speedup in the power mean"
    )


@dataclass(slots=True)
class _Job:
    spec: JobInput
    table: SpeedupTable | None
    current: int  # replicas held now with a placement that still fits, else 0
    valid_current: bool
    running: bool
    factor: float  # restart factor if its allocation changes
    pinned: bool


def _shape_ok(placement: Placement, nodes: Mapping[str, NodeCapacity], per_node: int) -> bool:
    if not placement or any(name not in nodes or g < 1 for name, g in placement):
        return False
    if len({name for name, _ in placement}) != len(placement):
        return False
    if len(placement) == 1:
        return True
    return all(g == per_node and nodes[name].gpus == per_node for name, g in placement)


def _valid_currents(jobs: Sequence[JobInput], cluster: ClusterCapacity) -> set[str]:
    """Jobs whose placement still exists and fits, whole-node rule included; on a node
    held past its GPUs (the cluster shrank) no job keeps its place there."""
    nodes = {n.name: n for n in cluster.nodes}
    ok = {j.job_id for j in jobs if _shape_ok(j.placement, nodes, cluster.gpus_per_node)}
    used: dict[str, int] = {}
    for j in jobs:
        if j.job_id in ok:
            for name, g in j.placement:
                used[name] = used.get(name, 0) + g
    over = {name for name, g in used.items() if g > nodes[name].gpus}
    return {
        j.job_id
        for j in jobs
        if j.job_id in ok and not any(name in over for name, _ in j.placement)
    }


def _value(job: _Job, replicas: int, kept: bool, scale: float, hysteresis: float) -> float:
    """The job's scaled speedup at `replicas`, penalised when its allocation changes."""
    if replicas == 0 or job.table is None:
        return 0.0
    speedup = job.table.speedup(replicas) * scale
    if kept:
        return speedup
    if job.running:
        return speedup * job.factor / (1 + hysteresis)
    return speedup


#: Repacks from scratch one search may try when a step fits no node as things lie: a
#: repack costs a pass over every job, a step a few node lookups.
REPACKS = 32


def _next_step(
    key: str,
    job: _Job,
    cur: int,
    free: int,
    banned: set[tuple[str, int]],
    term: Callable[[str, int], float],
) -> tuple[float, int] | None:
    """The job's next size worth more than its current one, and its gain per extra GPU:
    the next such size, not any larger one (a jump straight to a big size would take
    GPUs that another job's next size was worth more per GPU); None when that size needs
    more than the `free` GPUs (it never will fit: a search only hands GPUs out)."""
    assert job.table is not None
    here = term(key, cur)
    sizes = job.table.sizes
    for r in sizes[bisect.bisect_right(sizes, cur) :]:
        if r - cur > free:
            return None
        if (key, r) in banned:
            continue
        there = term(key, r)
        if there <= here or job.table.choice(r) is None:
            continue
        return (there - here) / (r - cur), r
    return None


def _greedy(
    jobs: Mapping[str, _Job],
    start: Mapping[str, int],
    packer: Packer,
    total: int,
    term: Callable[[str, int], float],
) -> tuple[dict[str, int], dict[str, Placement]] | None:
    """Hand GPUs out from `start`, one step of one job at a time, the step of most gain
    per GPU first (ties: the first job by id), while the steps still pack; then place
    the counts (see the module docstring)."""
    counts = dict(start)
    placed = packer.pack(counts)
    if placed is None:
        return None
    packing = packer.packing(placed)
    free = total - sum(counts.values())
    banned: set[tuple[str, int]] = set()
    order = {key: i for i, key in enumerate(sorted(jobs))}
    heap: list[tuple[float, int, str, int]] = []

    def push(key: str) -> None:
        found = _next_step(key, jobs[key], counts[key], free, banned, term)
        if found is not None:
            heapq.heappush(heap, (-found[0], order[key], key, found[1]))

    for key in sorted(jobs):
        job = jobs[key]
        if not job.pinned and job.table is not None:
            push(key)
    repacks = REPACKS
    failed = total + 1  # the smallest step a repack could not fit: larger ones fit no better
    while heap:
        _, _, key, r = heapq.heappop(heap)
        cur = counts[key]
        if r - cur > free:
            continue  # (the job's step outgrew the GPUs left: it has none now)
        fits = packing.grow(key, r)
        if not fits and repacks and r - cur < failed:
            repacks -= 1
            repacked = packer.pack({**counts, key: r})
            if repacked is None:
                failed = r - cur
            else:
                packing, fits = packer.packing(repacked), True
        if fits:
            counts[key] = r
            free -= r - cur
        else:
            banned.add((key, r))
        push(key)
    placed = packer.pack(counts) or {
        key: packer.placement(slots) for key, slots in packing.where.items() if slots
    }
    return counts, placed


def _same(a: Placement, b: Placement) -> bool:
    """The same GPUs on the same nodes, in whatever order the caller listed them."""
    return sorted(a) == sorted(b)


def _nodes_text(placement: Placement) -> str:
    return "+".join(f"{name}:{g}" for name, g in placement) or "none"


def schedule(
    now: float,
    cluster: ClusterCapacity,
    jobs: Sequence[JobInput],
    params: GoodputClusterParams | None = None,
) -> Schedule:
    """The allocation of this tick, as the changes to make (see the module docstring)."""
    p = params or GoodputClusterParams()
    check_jobs(jobs)
    arrived = sorted((j for j in jobs if j.submitted_at <= now), key=lambda j: j.job_id)
    if not arrived:
        return Schedule((), (), 0.0, 0.0)
    for j in arrived:
        if j.model is None:
            raise JobInputError(f"job {j.job_id!r} has no goodput model: goodput-cluster needs one")
    total = cluster.total_gpus
    whole = sum(1 for n in cluster.nodes if n.gpus == cluster.gpus_per_node)
    largest = max((n.gpus for n in cluster.nodes), default=0)
    candidates = SizeMenu(shapes(cluster.gpus_per_node, largest, whole) if total else [])
    grids: Grids = {}
    fair = fair_share(total, len(arrived))
    scale = len(cluster.nodes) / total if total else 0.0
    valid = _valid_currents(arrived, cluster)

    state: dict[str, _Job] = {}
    for j in arrived:
        running = bool(j.placement)
        ok = j.job_id in valid
        assert j.model is not None
        table = speedup_table(j.model, candidates, fair, grids)
        current = j.replicas if ok else 0
        if table is not None and current and table.choice(current) is None:
            # its size is one it may no longer have (limits changed): not kept
            current = 0
        state[j.job_id] = _Job(
            spec=j,
            table=table,
            current=current,
            valid_current=ok and current > 0,
            running=running,
            factor=restart_factor(now - j.submitted_at, j.restarts, p.rescale_cost_s),
            pinned=running and not j.preemptible and ok and current > 0,
        )

    terms: dict[tuple[str, int], float] = {}

    def term(key: str, r: int) -> float:
        """The job's term of the objective at `r` GPUs (kept when it holds them now)."""
        got = terms.get((key, r))
        if got is None:
            job = state[key]
            value = _value(job, r, r == job.current and r > 0, scale, p.hysteresis)
            got = terms[key, r] = utility(value, p.fairness_p, p.epsilon)
        return got

    packer = Packer(cluster, {k: PackedJob(j.spec.placement, j.current) for k, j in state.items()})
    keep = {k: job.current for k, job in state.items()}
    pinned_only = {k: (job.current if job.pinned else 0) for k, job in state.items()}

    def objective(counts: Mapping[str, int], placed: Mapping[str, Placement]) -> float:
        values = []
        for key, job in state.items():
            r = counts.get(key, 0)
            kept = r > 0 and job.valid_current and _same(placed.get(key, ()), job.spec.placement)
            values.append(_value(job, r, kept, scale, p.hysteresis))
        return power_mean(values, p.fairness_p, p.epsilon)

    current_placed = {k: state[k].spec.placement for k, r in keep.items() if r > 0}
    before = objective(keep, current_placed)
    best: tuple[float, dict[str, int], dict[str, Placement]] = (before, keep, current_placed)
    starts = [keep] if pinned_only == keep else [keep, pinned_only]
    for start in starts:
        found = _greedy(state, start, packer, total, term)
        if found is None:
            continue
        value = objective(*found)
        if value > best[0] * (1 + 1e-12):
            best = (value, *found)
    value, counts, placed = best

    decisions: list[JobChange] = []
    allocations: list[JobHolding] = []
    for key, job in state.items():
        r = counts.get(key, 0)
        placement = placed.get(key, ()) if r else ()
        spec = job.spec
        got = job.table.choice(r) if r and job.table is not None else None
        choice = got[1] if got is not None else None
        speedup = job.table.speedup(r) if r and job.table is not None else 0.0
        old = spec.replicas
        moved = not _same(placement, spec.placement) or (r > 0 and not job.valid_current)
        if not moved:
            batch_now = None
            if r and spec.local_batch is not None and choice is not None:
                assert got is not None
                shape = got[0]
                assert spec.model is not None
                batch_now = spec.model.evaluate(shape.nodes, r, spec.local_batch, spec.accumulation)
                same = (choice.local_batch, choice.accumulation) == (
                    spec.local_batch,
                    spec.accumulation,
                )
                if same or choice.goodput <= batch_now.goodput * (1 + p.hysteresis):
                    choice = batch_now
                else:
                    decisions.append(
                        JobChange(
                            key,
                            ChangeKind.REBATCH,
                            r,
                            placement,
                            choice.local_batch,
                            choice.accumulation,
                            choice.global_batch,
                            False,
                            f"batch {batch_now.global_batch} -> {choice.global_batch}: "
                            f"goodput x{choice.goodput / batch_now.goodput:.3g} in place",
                        )
                    )
            allocations.append(JobHolding(key, r, placement, choice, speedup))
            continue
        allocations.append(JobHolding(key, r, placement, choice, speedup))
        if r == 0:
            kind = ChangeKind.SUSPEND
        elif not spec.placement:
            kind = ChangeKind.ADMIT
        elif r < old:
            kind = ChangeKind.SHRINK
        elif r > old:
            kind = ChangeKind.GROW
        else:
            kind = ChangeKind.MOVE
        was = job.table.speedup(job.current) if job.table is not None and job.current else 0.0
        reason = (
            f"{old} -> {r} GPU(s) on {_nodes_text(placement)}: speedup {was:.3g} -> "
            f"{speedup:.3g} (fair share {fair} GPUs, objective {before:.4g} -> {value:.4g})"
        )
        decisions.append(
            JobChange(
                key,
                kind,
                r,
                placement,
                choice.local_batch if choice else None,
                choice.accumulation if choice else None,
                choice.global_batch if choice else None,
                True,
                reason,
            )
        )
    decisions.sort(key=change_order)
    return Schedule(tuple(decisions), tuple(allocations), value, before)


__all__ = ["GoodputClusterParams", "schedule"]
