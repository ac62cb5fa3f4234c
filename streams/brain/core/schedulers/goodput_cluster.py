"""goodput-cluster: one allocation of the env's GPUs across all its arrived jobs per round.

Per-job optimizers each see one job and so cannot trade one job's GPUs for another's; a
cluster with more demand than GPUs needs that trade (who to admit, who to shrink or
suspend). This allocator maximises Pollux's objective, the p = -1 power mean of every
arrived job's speedup over a fair share, with a cheap deterministic search instead of
Pollux's genetic algorithm:

0. the cluster is divided first (`sharing.py`): what Kueue's running jobs hold is set
   aside (they may only shrink inside it), and each quota's jobs get floors, their
   smallest sizes in priority order then grown by gain into the quota's room;
1. per job, its best batch and speedup at every size the whole-node rule allows
   (1..GPUs-per-node on one node, or whole nodes; of its GPU type's nodes);
2. greedy marginal goodput: repeatedly give the job whose objective term gains the most
   per extra GPU its next size worth more than its current one (skipping sizes worth
   less, e.g. below the size it holds and would keep without a restart), as long as the
   sizes still pack onto the nodes, and no job of lower priority than one still waiting
   for its first GPUs takes a step;
   run once from the floors (so preemption and shrinking are possible) and once from the
   current allocation (only growing into free GPUs); keep the better, or the current
   allocation when neither beats it, of those that meet every floor and leave no job
   waiting while a lower-priority one borrows what it needs;
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
from streams.brain.core.schedulers.sharing import guarantee, set_aside
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
    pinned: bool  # holds what it holds: not preemptible, or Kueue's
    kueue: bool = False
    floor: int = 0  # GPUs its group's quota guarantees it this round


def _shape_ok(
    placement: Placement, nodes: Mapping[str, NodeCapacity], per_node: int, gpu_type: str | None
) -> bool:
    if not placement or any(name not in nodes or g < 1 for name, g in placement):
        return False
    if gpu_type is not None and any(nodes[name].gpu_type != gpu_type for name, _ in placement):
        return False
    if len({name for name, _ in placement}) != len(placement):
        return False
    if len(placement) == 1:
        return True
    return all(g == per_node and nodes[name].gpus == per_node for name, g in placement)


def _valid_currents(jobs: Sequence[JobInput], cluster: ClusterCapacity) -> set[str]:
    """Jobs whose placement still exists and fits, whole-node rule and GPU type included;
    on a node held past its GPUs (the cluster shrank) no job keeps its place there."""
    nodes = {n.name: n for n in cluster.nodes}
    ok = {
        j.job_id for j in jobs if _shape_ok(j.placement, nodes, cluster.gpus_per_node, j.gpu_type)
    }
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


def _menu(cluster: ClusterCapacity, gpu_type: str | None) -> SizeMenu:
    """The sizes the whole-node rule allows on the cluster's nodes (of one GPU type)."""
    nodes = [n for n in cluster.nodes if gpu_type is None or n.gpu_type == gpu_type]
    if not sum(n.gpus for n in nodes):
        return SizeMenu([])
    whole = sum(1 for n in nodes if n.gpus == cluster.gpus_per_node)
    largest = max(n.gpus for n in nodes)
    return SizeMenu(shapes(cluster.gpus_per_node, largest, whole))


def _within(
    r: int, held: Mapping[str, int], full: Mapping[str, int], per_node: int
) -> Placement | None:
    """`r` GPUs placed inside what a Kueue job holds (node -> GPUs, in node order): one
    node with room, the one it holds most on; past a node, whole nodes it holds whole."""
    if r <= per_node:
        room = [(g, name) for name, g in held.items() if g >= r]
        if not room:
            return None
        most = max(g for g, _ in room)
        return ((next(name for g, name in room if g == most), r),)
    whole = [name for name, g in held.items() if g == per_node == full[name]]
    if len(whole) < r // per_node:
        return None
    return tuple((name, per_node) for name in whole[: r // per_node])


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


def _grow_within(
    floors: Mapping[str, int],
    room: Mapping[str, int],
    jobs: Mapping[str, _Job],
    term: Callable[[str, int], float],
) -> dict[str, int]:
    """The guaranteed sizes grown into each group's room left, the next size worth more
    of most gain per GPU first (ties: the first job by id), as the search grows jobs."""
    sizes = dict(floors)
    left = dict(room)
    heap: list[tuple[float, str, int]] = []

    def push(key: str) -> None:
        group = jobs[key].spec.group
        assert group is not None
        found = _next_step(key, jobs[key], sizes[key], left[group], set(), term)
        if found is not None:
            heapq.heappush(heap, (-found[0], key, found[1]))

    for key in sorted(sizes):
        push(key)
    while heap:
        _, key, r = heapq.heappop(heap)
        group = jobs[key].spec.group
        assert group is not None
        if r - sizes[key] > left[group]:
            continue
        left[group] -= r - sizes[key]
        sizes[key] = r
        push(key)
    return sizes


def _greedy(
    jobs: Mapping[str, _Job],
    start: Mapping[str, int],
    packer: Packer,
    total: int,
    term: Callable[[str, int], float],
) -> tuple[dict[str, int], dict[str, Placement]] | None:
    """Hand GPUs out from `start`, one step of one job at a time, the step of most gain
    per GPU first (ties: the first job by id), while the steps still pack; then place
    the counts (see the module docstring). While a job waits for its first GPUs with a
    step to take, no job of lower priority takes a step: its steps wait aside until the
    waiting job is admitted or has no step left."""
    counts = dict(start)
    placed = packer.pack(counts)
    if placed is None:
        return None
    packing = packer.packing(placed)
    free = total - sum(counts.values())
    banned: set[tuple[str, int]] = set()
    order = {key: i for i, key in enumerate(sorted(jobs))}
    Step = tuple[float, int, str, int]
    heap: list[Step] = []
    #: priority -> jobs without GPUs that have a step (in the heap or aside)
    waiting: dict[int, int] = {}
    aside: dict[int, list[Step]] = {}

    def priority(key: str) -> int:
        return jobs[key].spec.priority

    def push(key: str) -> None:
        found = _next_step(key, jobs[key], counts[key], free, banned, term)
        if found is not None:
            heapq.heappush(heap, (-found[0], order[key], key, found[1]))
            if not counts[key]:
                waiting[priority(key)] = waiting.get(priority(key), 0) + 1

    def first_waiting() -> int | None:
        return max((p for p, n in waiting.items() if n), default=None)

    def release(every: bool = False) -> None:
        top = None if every else first_waiting()
        for level in [level for level in aside if top is None or level >= top]:
            for step in aside.pop(level):
                heapq.heappush(heap, step)

    for key in sorted(jobs):
        job = jobs[key]
        if key in counts and not job.pinned and job.table is not None:
            push(key)
    repacks = REPACKS
    failed = total + 1  # the smallest step a repack could not fit: larger ones fit no better
    while heap or aside:
        if not heap:
            release(every=True)  # (whoever waits has a step in the heap: none waits)
            continue
        step = heapq.heappop(heap)
        _, _, key, r = step
        cur = counts[key]
        if not cur:
            waiting[priority(key)] -= 1
        if r - cur > free:
            release()
            continue  # (the job's step outgrew the GPUs left: it has none now)
        top = first_waiting()
        if top is not None and priority(key) < top:
            aside.setdefault(priority(key), []).append(step)
            if not cur:
                waiting[priority(key)] += 1
            continue
        fits = packing.grow(key, r, jobs[key].spec.gpu_type)
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
        release()
    placed = packer.pack(counts) or {
        key: packer.placement(slots) for key, slots in packing.where.items() if slots
    }
    return counts, placed


def _same(a: Placement, b: Placement) -> bool:
    """The same GPUs on the same nodes, in whatever order the caller listed them."""
    return sorted(a) == sorted(b)


def _nodes_text(placement: Placement) -> str:
    return "+".join(f"{name}:{g}" for name, g in placement) or "none"


def _arrived(now: float, jobs: Sequence[JobInput]) -> list[JobInput]:
    """Inputs checked: the jobs submitted at or before `now`, by id, each with the
    goodput model this scheduler needs (JobInputError otherwise)."""
    check_jobs(jobs)
    arrived = sorted((j for j in jobs if j.submitted_at <= now), key=lambda j: j.job_id)
    for j in arrived:
        if j.model is None:
            raise JobInputError(f"job {j.job_id!r} has no goodput model: goodput-cluster needs one")
    return arrived


@dataclass(slots=True)
class _Round:
    """What one round decides over: the jobs it decides (Kueue's running jobs with what
    they hold, the rest with what is left open), and the figures every job's value uses."""

    p: GoodputClusterParams
    cluster: ClusterCapacity
    open_cluster: ClusterCapacity
    kueue_held: dict[str, dict[str, int]]
    state: dict[str, _Job]
    total: int  # GPUs handed out here (Kueue's held set aside)
    fair: int  # GPUs of a fair share, for the speedups and the reasons
    scale: float  # nodes per GPU: the speedups' scale
    full: dict[str, int]  # node -> its GPUs


def _candidates(
    now: float, cluster: ClusterCapacity, arrived: Sequence[JobInput], p: GoodputClusterParams
) -> _Round:
    """Candidates: per decided job, its speedup at every size the whole-node rule allows,
    what it holds now and may keep, and the restart factor a change would cost it."""
    # what Kueue's running jobs hold is theirs; the rest is handed out here
    open_cluster, kueue_held = set_aside(cluster, arrived)
    decided = [j for j in arrived if not j.kueue_managed or j.job_id in kueue_held]
    menus = {kind: _menu(open_cluster, kind) for kind in {None, *(j.gpu_type for j in decided)}}
    grids: Grids = {}
    fair = fair_share(cluster.total_gpus, len(decided))
    scale = len(cluster.nodes) / cluster.total_gpus if cluster.total_gpus else 0.0
    valid = _valid_currents([j for j in decided if not j.kueue_managed], open_cluster)
    full = {n.name: n.gpus for n in cluster.nodes}

    state: dict[str, _Job] = {}
    for j in decided:
        assert j.model is not None
        running = bool(j.placement)
        kueue = j.kueue_managed
        menu = _menu(cluster, j.gpu_type) if kueue else menus[j.gpu_type]
        table = speedup_table(j.model, menu, fair, grids)
        ok = j.job_id in valid or kueue
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
            pinned=kueue or (running and not j.preemptible and ok and current > 0),
            kueue=kueue,
        )
    return _Round(
        p, cluster, open_cluster, kueue_held, state, open_cluster.total_gpus, fair, scale, full
    )


def _terms(rnd: _Round) -> Callable[[str, int], float]:
    """The objective's term of a job at a size, computed once per round and size."""
    terms: dict[tuple[str, int], float] = {}
    state, scale, p = rnd.state, rnd.scale, rnd.p

    def term(key: str, r: int) -> float:
        """The job's term of the objective at `r` GPUs (kept when it holds them now)."""
        got = terms.get((key, r))
        if got is None:
            job = state[key]
            value = _value(job, r, r == job.current and r > 0, scale, p.hysteresis)
            got = terms[key, r] = utility(value, p.fairness_p, p.epsilon)
        return got

    return term


def _kueue_sizes(rnd: _Round) -> tuple[dict[str, int], dict[str, Placement]]:
    """Kueue's jobs: the size worth most within what they hold (keeping it, on a tie)."""
    p = rnd.p
    fixed_counts: dict[str, int] = {}
    fixed_placed: dict[str, Placement] = {}
    for key, job in rnd.state.items():
        if not job.kueue:
            continue
        held = rnd.kueue_held[key]
        options: list[tuple[float, bool, int, Placement]] = []
        if job.table is not None:
            for r in job.table.sizes:
                placement = _within(r, held, rnd.full, rnd.open_cluster.gpus_per_node)
                if placement is None or job.table.choice(r) is None:
                    continue
                kept = job.valid_current and _same(placement, job.spec.placement)
                value = _value(job, r, kept, rnd.scale, p.hysteresis)
                options.append((utility(value, p.fairness_p, p.epsilon), kept, r, placement))
        if options:
            _, _, r, placement = max(options, key=lambda o: (o[0], o[1], o[2]))
        else:
            r, placement = job.spec.replicas, job.spec.placement  # (nothing to decide)
        fixed_counts[key], fixed_placed[key] = r, placement
    return fixed_counts, fixed_placed


def _floors(
    rnd: _Round,
    ours: Mapping[str, _Job],
    packer: Packer,
    term: Callable[[str, int], float],
) -> tuple[dict[str, int], dict[str, int]]:
    """Quotas: each group's jobs, priority first, get their smallest size while it has
    room, then grow into what the quota has left; the floors are those that pack (the
    last claims dropped until they do), set on each job. Returns the floors and each
    job's smallest size (`need`)."""
    held_anyway = {k: job.current for k, job in ours.items() if job.pinned}
    need = {
        k: next((r for r in job.table.sizes if job.table.choice(r)), 0)
        for k, job in ours.items()
        if job.table is not None
    }
    by_claim = sorted(
        (job.spec for job in ours.values()),
        key=lambda j: (-j.priority, not j.placement, j.submitted_at, j.job_id),
    )
    kueue_gpus = sum(g for held in rnd.kueue_held.values() for g in held.values())
    owed = rnd.cluster.guaranteed(kueue_gpus)
    least = guarantee(by_claim, need, held_anyway, owed)
    # ... then grow, the step of most gain per GPU first, into what each quota has left:
    # a quota is the GPUs its jobs can use, not one each
    room = dict(owed)
    for key, gpus in [*held_anyway.items(), *least.items()]:
        group = ours[key].spec.group
        if group is not None and group in room:
            room[group] -= gpus
    grown = _grow_within(least, room, ours, term)
    floors: dict[str, int] = {}
    for tried in (grown, least):
        start = {k: (job.current if job.pinned else tried.get(k, 0)) for k, job in ours.items()}
        if packer.pack(start) is not None:
            floors = dict(tried)
            break
    else:
        floors = dict(least)
        for key in reversed(list(least)):  # (what cannot all be placed: the last go)
            del floors[key]
            start = {k: (j.current if j.pinned else floors.get(k, 0)) for k, j in ours.items()}
            if packer.pack(start) is not None:
                break
    for key, size in floors.items():
        ours[key].floor = size
    return floors, need


def _search(
    rnd: _Round,
    ours: Mapping[str, _Job],
    packer: Packer,
    term: Callable[[str, int], float],
    floors: Mapping[str, int],
    need: Mapping[str, int],
    fixed: tuple[dict[str, int], dict[str, Placement]],
) -> tuple[float, float, dict[str, int], dict[str, Placement]]:
    """Search, admission and preemption: the greedy run from the current allocation and
    from the floors; the better of those fair to quotas and priority, or the current
    allocation when neither beats it. Returns the objective after and before, and the
    GPUs and placement of every decided job (Kueue's included)."""
    p, state, scale, total = rnd.p, rnd.state, rnd.scale, rnd.total
    fixed_counts, fixed_placed = fixed
    floor_start = {k: (job.current if job.pinned else floors.get(k, 0)) for k, job in ours.items()}
    keep = {k: job.current for k, job in ours.items()}
    keep_start = {k: max(job.current, job.floor) for k, job in ours.items()}

    def objective(counts: Mapping[str, int], placed: Mapping[str, Placement]) -> float:
        values = []
        for key, job in state.items():
            r = counts.get(key, 0)
            kept = r > 0 and job.valid_current and _same(placed.get(key, ()), job.spec.placement)
            values.append(_value(job, r, kept, scale, p.hysteresis))
        return power_mean(values, p.fairness_p, p.epsilon)

    def fair_to_quotas_and_priority(counts: Mapping[str, int]) -> bool:
        """Every guarantee met, and no job waits while one of lower priority borrows
        GPUs it could have (held beyond any guarantee, preemptible)."""
        if any(counts[k] < job.floor for k, job in ours.items()):
            return False
        borrowed = {
            k: counts[k]
            for k, job in ours.items()
            if counts[k] and not job.pinned and not job.floor
        }
        idle = total - sum(counts.values())
        for key, job in ours.items():
            if counts[key] or key not in need or job.pinned:
                continue
            lower = sum(g for k, g in borrowed.items() if ours[k].spec.priority < job.spec.priority)
            if lower and need[key] <= lower + idle:
                return False
        return True

    current_placed = {k: state[k].spec.placement for k, r in keep.items() if r > 0}
    before = objective({**keep, **fixed_counts}, {**current_placed, **fixed_placed})
    best: tuple[float, dict[str, int], dict[str, Placement]] | None = None
    if fair_to_quotas_and_priority(keep):
        best = (before, keep, current_placed)
    starts = [keep_start] if floor_start == keep_start else [keep_start, floor_start]
    for start in starts:
        found = _greedy(ours, start, packer, total, term)
        if found is None:
            continue
        if start is keep_start and not fair_to_quotas_and_priority(found[0]):
            continue
        value = objective({**found[0], **fixed_counts}, {**found[1], **fixed_placed})
        if best is None or value > best[0] * (1 + 1e-12):
            best = (value, *found)
    if best is None:  # (nothing placeable: keep what runs)
        best = (before, keep, current_placed)
    value, counts, placed = best
    return value, before, {**counts, **fixed_counts}, {**placed, **fixed_placed}


def _plans(
    rnd: _Round,
    arrived: Sequence[JobInput],
    counts: Mapping[str, int],
    placed: Mapping[str, Placement],
    value: float,
    before: float,
) -> Schedule:
    """Plans: what every arrived job holds after the round, and the changes to make (a
    new placement, with why; a batch change in place only past the hysteresis)."""
    p, state, fair = rnd.p, rnd.state, rnd.fair
    decisions: list[JobChange] = []
    allocations: list[JobHolding] = []
    for spec in arrived:
        key = spec.job_id
        if key not in state:  # (Kueue has not admitted it: not ours to decide)
            allocations.append(JobHolding(key, 0, (), None, 0.0))
            continue
        job = state[key]
        r = counts.get(key, 0)
        placement = placed.get(key, ()) if r else ()
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
        why = f"; {spec.group}'s quota guarantees {job.floor}" if job.floor else ""
        reason = (
            f"{old} -> {r} GPU(s) on {_nodes_text(placement)}: speedup {was:.3g} -> "
            f"{speedup:.3g} (fair share {fair} GPUs, objective {before:.4g} -> {value:.4g}"
            f"{why})"
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


def schedule(
    now: float,
    cluster: ClusterCapacity,
    jobs: Sequence[JobInput],
    params: GoodputClusterParams | None = None,
) -> Schedule:
    """The allocation of this round, as the changes to make (see the module docstring),
    in the round's stages: inputs checked, candidates, Kueue's sizes and the quotas'
    floors, the search (admission and preemption), the plans."""
    p = params or GoodputClusterParams()
    arrived = _arrived(now, jobs)
    if not arrived:
        return Schedule((), (), 0.0, 0.0)
    rnd = _candidates(now, cluster, arrived, p)
    term = _terms(rnd)
    fixed = _kueue_sizes(rnd)
    ours = {k: job for k, job in rnd.state.items() if not job.kueue}
    packer = Packer(
        rnd.open_cluster,
        {k: PackedJob(j.spec.placement, j.current, j.spec.gpu_type) for k, j in ours.items()},
    )
    floors, need = _floors(rnd, ours, packer, term)
    value, before, counts, placed = _search(rnd, ours, packer, term, floors, need, fixed)
    return _plans(rnd, arrived, counts, placed, value, before)


__all__ = ["GoodputClusterParams", "schedule"]
