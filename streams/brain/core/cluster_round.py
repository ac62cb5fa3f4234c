"""One round of the env's cluster scheduler: the brain's job states in, plans out.

The scheduler (`streams.brain.core.schedulers`) sees jobs as goodput models and placements;
the brain keeps jobs as states folded from their events. This module is the translation
both ways, pure: what each arrived job looks like to the scheduler (its throughput model
fitted from its own profile, its gradient statistics, its batch limits, what the brain
gave it last), and what each of the scheduler's decisions becomes (an OptimizePlan that
says why, a ScalePlan the operator applies, and the job's new `Share`).

A job is explored as Pollux explores it: it may grow to at most twice the largest size
it has been measured at, so its fitted model is never trusted far beyond its data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from dlrover_events.domain.units import human_bytes
from schemas.cluster import CapacityReported
from schemas.env_settings import LimitSettings, SchedulerSettings
from schemas.jobs import OOMKind
from schemas.plans import NodeGroupResource, NodeResource, OptimizePlan, ResourcePlan, ScalePlan
from streams.brain.core.folds import record_decision
from streams.brain.core.planner import memory_step, plan_envelope, plan_id
from streams.brain.core.policy import Policy
from streams.brain.core.schedulers.api import (
    ChangeKind,
    ClusterCapacity,
    GroupQuota,
    JobChange,
    JobInput,
    NodeCapacity,
    Schedule,
)
from streams.brain.core.schedulers.goodput import (
    BatchLimits,
    GradStats,
    JobModel,
    PerfParams,
    StepSample,
    fit_perf_params,
)
from streams.brain.core.state import WORKER, BatchBounds, JobState, JobStatus, Share

#: A job never measured: one second per micro-step whatever its batch. Its exploration
#: bound (one replica) keeps this guess from deciding anything but its admission.
PRIOR = PerfParams(alpha_c=1.0, beta_c=0.0)

#: The stage a scheduler's plans are filed under.
STAGE = "running"


@dataclass(frozen=True, slots=True)
class RoundResult:
    """What one round decided: the new states of the jobs it changed (or whose service
    it counted) and the plans to publish, in the order to publish them."""

    states: Mapping[str, JobState]
    plans: Sequence[OptimizePlan | ScalePlan]
    schedule: Schedule


def _node_order(name: str) -> tuple[int, str]:
    head, _, tail = name.rpartition("-")
    return (int(tail), head) if tail.isdigit() else (1 << 30, name)


def scheduled(state: JobState) -> bool:
    """Whether the scheduler decides for the job: a live data-parallel job. One that did
    not say its batch (a TrainingJob without `spec.batch`) is scheduled as a gang of the
    replicas it asked for, whose batch is its own business (see `job_model`)."""
    return (
        state.status in (JobStatus.SUBMITTED, JobStatus.RUNNING)
        and not state.awaiting_arrival
        and not state.on_hold
        and state.submitted_at is not None
        and state.distribution == "allreduce"
    )


def _gang(state: JobState) -> int:
    """The workers a job asked for."""
    role = state.roles.get(WORKER)
    return max(1, role.replicas if role is not None else 1)


def job_model(state: JobState) -> JobModel:
    """The job as the scheduler sees it: step time fitted from its profile, statistical
    efficiency from its latest gradient statistics, limits from its submission and how
    far it has been measured."""
    bounds = state.batch_bounds
    if bounds is None:
        # A job that did not say its batch: a gang of what it asked for or nothing, at one
        # sample per replica (the scheduler never changes its batch, so that batch is
        # only a unit: what counts is how its step time grows with the workers).
        gang = _gang(state)
        bounds = BatchBounds(init_batch=gang, max_batch=gang, min_local=1, max_local=1)
        role = state.roles.get(WORKER)
        if role is not None:
            role = role.model_copy(update={"min_replicas": gang, "max_replicas": gang})
    else:
        role = state.roles.get(WORKER)
    samples = [
        StepSample(p.nodes, p.replicas, p.local_batch, p.accumulation, p.step_time, p.sync_time)
        for p in state.profile
    ]
    perf = fit_perf_params(samples) or PRIOR
    measured = max((p.replicas for p in state.profile), default=0)
    explore = max(1, 2 * measured)
    if role is not None and role.max_replicas:
        explore = min(explore, role.max_replicas)
    if state.batch_bounds is None:
        explore = _gang(state)  # (never explored: it runs what it asked for)
    min_replicas = min(role.min_replicas or 1, explore) if role is not None else 1
    max_local = bounds.max_local
    min_local = min(bounds.min_local or 1, max_local) if max_local else (bounds.min_local or 1)
    # An adaptive job trains from the smallest batch it converges at (Pollux's initial
    # batch), not from the one it was submitted with: that one may be a baseline's large
    # fixed batch, worth little early in training.
    init = min(bounds.min_batch or bounds.init_batch, bounds.init_batch)
    if not bounds.adaptive:
        init = bounds.init_batch
    grad = None
    if bounds.adaptive and state.grad_stats is not None:
        sqr, var = state.grad_stats
        grad = GradStats(sqr=sqr, var=var / init)  # var: one sample's (RuntimeSample)
    limits = BatchLimits(
        init_batch=init,
        max_batch=max(bounds.max_batch or bounds.init_batch, init),
        min_local=max(1, min_local),
        max_local=max_local,
        adaptive=bounds.adaptive,
        min_replicas=max(1, min_replicas),
        max_replicas=explore,
    )
    return JobModel(perf, grad, limits)


def batch_in_force(state: JobState) -> tuple[int | None, int]:
    """The (local batch, accumulation) a round takes the job to train with.

    Training knobs are the job's to apply: a round's plan asks for them, the job confirms
    them (training.applied) at a step boundary, and only that confirmation makes them the
    job's (as for the per-job optimizers). So once the job confirmed what it trains with
    and no plan's knobs await it, its own word counts, whatever the share planned (a job
    that clamped or kept its batch is scheduled at the batch it runs). While a plan is
    unanswered or its knobs await the job, the planned ones count, so that the next round
    does not ask for them again."""
    share = state.share or Share()
    awaited = state.awaiting_training
    if state.pending_scale_plan is not None or (
        awaited is not None and awaited.training.keys() & _KNOBS
    ):
        return share.local_batch, share.accumulation
    local, accumulation = (
        state.training.get("local_batch_size"),
        state.training.get("accumulation_steps", 1),
    )
    if isinstance(local, int) and local >= 1:
        return local, accumulation if isinstance(accumulation, int) and accumulation >= 1 else 1
    return share.local_batch, share.accumulation


#: The training knobs a round's plan sets.
_KNOBS = frozenset({"local_batch_size", "accumulation_steps"})


def job_input(state: JobState) -> JobInput:
    share = state.share or Share()
    role = state.roles.get(WORKER)
    assert state.submitted_at is not None
    local_batch, accumulation = batch_in_force(state)
    return JobInput(
        job_id=state.job.uuid,
        submitted_at=state.submitted_at.timestamp(),
        model=job_model(state),
        placement=tuple(sorted(share.placement.items(), key=lambda kv: _node_order(kv[0]))),
        local_batch=local_batch,
        accumulation=accumulation,
        restarts=share.restarts,
        requested_replicas=max(1, role.replicas if role is not None else 1),
        attained_gpu_s=share.attained_gpu_s,
        priority=state.priority,
        group=state.group,
        kueue_managed=state.kueue_queue is not None,
    )


def cluster_capacity(
    settings: SchedulerSettings, nodes: ClusterCapacity | None = None
) -> ClusterCapacity:
    """What a round hands out: the nodes the platform reports (`nodes`), else the static
    `nodes` x `gpus_per_node` of the settings (a virtual env's cluster), with the
    settings' quotas."""
    quotas = tuple(GroupQuota(group, gpus) for group, gpus in sorted(settings.quotas.items()))
    if nodes is None:
        return ClusterCapacity.uniform(settings.nodes, settings.gpus_per_node, quotas)
    return replace(nodes, quotas=quotas)


def platform_capacity(report: CapacityReported) -> ClusterCapacity:
    """The nodes a platform reported, as a round hands them out: only those taking new
    pods (a cordoned or NotReady node's GPUs are not the scheduler's to give), a
    multi-node job taking whole nodes of the largest size."""
    return ClusterCapacity(
        tuple(
            NodeCapacity(host.name, host.gpus, host.gpu_type)
            for host in sorted(report.hosts, key=lambda h: _node_order(h.name))
            if host.schedulable and host.gpus > 0
        )
    )


def memory_for(state: JobState, local_batch: int, limits: LimitSettings) -> int:
    """Host memory one replica needs at `local_batch`, never less than it has: the line
    through the smallest and largest local batch it was measured at (a replica's memory
    is a fixed part plus a part per sample), or, measured at one, that one scaled by the
    batch (an upper bound for a larger batch); capped by the planner's limit. 0 (keep
    what it has) when nothing is known."""
    role = state.roles.get(WORKER)
    current = role.memory if role is not None else 0
    points = sorted(
        {(p.local_batch, p.memory) for p in state.profile if p.memory > 0}, key=lambda x: x
    )
    if points:
        (b0, m0), (b1, m1) = points[0], points[-1]
        if b1 > b0 and m1 >= m0:
            need = m0 + (m1 - m0) * (local_batch - b0) / (b1 - b0)
        else:
            need = m0 * local_batch / b0 if local_batch > b0 else m0
    elif current and state.batch_bounds is not None and role is not None and role.replicas:
        sized_for = math.ceil(state.batch_bounds.init_batch / role.replicas)
        need = current * local_batch / sized_for if local_batch > sized_for else current
    else:
        return 0
    wanted = min(max(current, math.ceil(need)), max(limits.max_memory, current))
    return wanted if wanted != current else 0


def _account(share: Share, now: datetime) -> Share:
    """The share with its attained service counted up to `now` (a job without GPUs
    attains nothing: its clock starts when it is given some)."""
    replicas = share.replicas
    if not replicas:
        return share
    if share.since is None:
        return share.model_copy(update={"since": now})
    held = max(0.0, (now - share.since).total_seconds())
    return share.model_copy(
        update={"attained_gpu_s": share.attained_gpu_s + replicas * held, "since": now}
    )


def _largest_local(state: JobState, change: JobChange) -> int | None:
    """The largest local batch a later round may give the job at this size without moving
    it: a batch-only change applies in place, with the memory the pods already have, so
    they are given what that batch needs now (a GPU's worth of host memory is more than
    any traced replica needs; a replica short of it stalls its whole gang)."""
    bounds, local = state.batch_bounds, change.local_batch
    if local is None or bounds is None or not bounds.adaptive or not change.replicas:
        return local
    largest = max(bounds.max_batch or bounds.init_batch, bounds.init_batch)
    cap = min(bounds.max_local or largest, largest // change.replicas)
    return max(local, cap)


def _plans(
    state: JobState,
    change: JobChange,
    now: datetime,
    scheduler: str,
    limits: LimitSettings,
    round_cause: str,
    memory: int | None = None,
) -> tuple[OptimizePlan, ScalePlan]:
    cause = f"{scheduler}@{now.isoformat()}/{round_cause}"
    optimize_id = plan_id(state.job.uuid, cause, "optimize")
    scale_id = plan_id(state.job.uuid, cause, "scale")
    training: dict[str, object] = {}
    declared = state.batch_bounds is not None  # (else its batch is not the brain's)
    if change.local_batch is not None and declared:
        training["local_batch_size"] = change.local_batch
    if change.accumulation is not None and declared:
        training["accumulation_steps"] = change.accumulation
    groups: dict[str, NodeGroupResource] = {}
    if change.kind is not ChangeKind.SUSPEND and change.kind is not ChangeKind.REBATCH:
        if memory is None and not declared:
            memory = 0  # (its memory was sized by whoever sized its batch)
        if memory is None:
            local = _largest_local(state, change)
            memory = memory_for(state, local, limits) if local else 0
        groups[WORKER] = NodeGroupResource(
            count=change.replicas, node_resource=NodeResource(memory=memory)
        )
    resource = ResourcePlan(node_group_resources=groups, training=training)
    optimize = OptimizePlan(
        **plan_envelope(state, optimize_id, now),
        stage=STAGE,
        optimizer=scheduler,
        reason=f"{change.kind.value}: {change.reason}",
        resource=resource,
        caused_by=cause,
    )
    scale = ScalePlan(
        **plan_envelope(state, scale_id, now),
        source_plan=optimize_id,
        node_group_resources=groups,
        training=training,
        placement=dict(change.placement) if change.kind is not ChangeKind.REBATCH else {},
        suspend=change.kind is ChangeKind.SUSPEND,
    )
    return optimize, scale


def _shared(share: Share, change: JobChange, now: datetime) -> Share:
    """The share after the change: where the job is and with what batch, and one more
    restart when a job that held GPUs is moved, resized or suspended."""
    if change.kind is ChangeKind.REBATCH:
        return share.model_copy(
            update={
                "local_batch": change.local_batch,
                "accumulation": change.accumulation or 1,
            }
        )
    restarted = bool(share.placement)
    return share.model_copy(
        update={
            "placement": dict(change.placement),
            "local_batch": change.local_batch,
            "accumulation": change.accumulation or 1,
            "restarts": share.restarts + (1 if restarted else 0),
            "since": now,
        }
    )


def _oom_decision(
    state: JobState, limits: LimitSettings
) -> tuple[JobChange, tuple[str, ...], int] | None:
    """A job out of host memory stays stalled on its GPUs until a plan gives it more: its
    share again, with the memory the OOM said it needs (else twice what it has), raised
    at most the planner's step and capped by its limit. GPU OOMs are the batch's: the
    scheduler keeps local batches within the job's declared range."""
    share = state.share
    if share is None or not share.replicas:
        return None
    records = [
        r
        for rs in state.ooms.values()
        for r in rs
        if not r.handled and r.kind is OOMKind.HOST_MEMORY
    ]
    if not records:
        return None
    role = state.roles.get(WORKER)
    current = role.memory if role is not None else 0
    need = max((r.memory or 0 for r in records), default=0) or 2 * current
    wanted = memory_step(current, min(max(need, current), limits.max_memory), limits)
    if wanted <= current:
        return None  # (at its limit: nothing a plan can give)
    placement = tuple(sorted(share.placement.items(), key=lambda kv: _node_order(kv[0])))
    change = JobChange(
        state.job.uuid,
        ChangeKind.MOVE,
        share.replicas,
        placement,
        share.local_batch,
        share.accumulation,
        None,
        True,
        f"out of host memory: {human_bytes(current)} -> {human_bytes(wanted)} per replica, "
        "same GPUs",
    )
    return change, tuple(sorted(r.event_id for r in records)), wanted


def run_round(
    states: Mapping[str, JobState],
    now: datetime,
    policy: Policy,
    cause: str = "",
    nodes: ClusterCapacity | None = None,
) -> RoundResult:
    """The round at `now` of the policy's scheduler over every job the brain holds:
    which jobs it decides for is `scheduled`; the rest are left alone. `nodes` is the
    cluster as the platform reports it (None: the settings' static cluster)."""
    spec, chosen, lim = policy.scheduler_spec, policy.scheduler, policy.limits
    if spec is None or chosen is None:
        raise ValueError("the env's policy has no cluster scheduler")
    jobs = {u: s for u, s in states.items() if scheduled(s) and s.submitted_at <= now}  # type: ignore[operator]
    accounted: dict[str, JobState] = {}
    for uuid, state in jobs.items():
        if state.share is None:
            continue
        share = _account(state.share, now)
        if share is not state.share:
            accounted[uuid] = state.model_copy(update={"share": share})
    jobs = {**jobs, **accounted}
    cluster = cluster_capacity(chosen, nodes)
    inputs = [job_input(jobs[u]) for u in sorted(jobs)]
    result = spec.run(now.timestamp(), cluster, inputs, policy.scheduler_params)
    changed = dict(accounted)
    plans: list[OptimizePlan | ScalePlan] = []
    decided = {c.job_id for c in result.changes}
    for change in result.changes:
        state = jobs[change.job_id]
        if change.kind is ChangeKind.REBATCH and state.batch_bounds is None:
            continue  # (a batch the job did not say is not the brain's to change)
        optimize, scale = _plans(state, change, now, spec.name, lim, cause)
        held = state.share or Share()
        share = _shared(held, change, now).planned(scale.plan_id, held)
        after = state.model_copy(update={"share": share})
        changed[change.job_id] = record_decision(after, optimize, scale, (), now)
        plans.extend((optimize, scale))
    for uuid in sorted(set(jobs) - decided):
        state = jobs[uuid]
        found = _oom_decision(state, lim)
        if found is None:
            continue
        change, handled, memory = found
        optimize, scale = _plans(state, change, now, spec.name, lim, cause, memory)
        changed[uuid] = record_decision(state, optimize, scale, handled, now)
        plans.extend((optimize, scale))
    return RoundResult(changed, plans, result)


__all__ = [
    "PRIOR",
    "RoundResult",
    "batch_in_force",
    "cluster_capacity",
    "job_input",
    "job_model",
    "memory_for",
    "platform_capacity",
    "run_round",
    "scheduled",
]
