"""Parity with DLRover's Brain: its resource algorithms for PS and worker jobs.

The formulas are those of DLRover's Brain optimizers, as this project's spec restates
them (the tests cite each rule). Where the original had known
defects, these differ on purpose: zero workers never divide, OOM optimizers act only on
OOM events not yet answered (never twice for one OOM), and parameters are typed values
rather than config keys looked up as values.

A memory taken from the samples' use (worker-resource, PS-init-adjust, PS-util) is rounded
up to a whole `memory_unit` (256 MiB by default), as the spec rounds cpu up to whole cores:
a process's memory moves by a few pages from one sample to the next, and a target that
followed it would be a new wish, so a new plan, every time the brain decides (seen with the
example job: worker-resource's target 422,127,207 then 422,776,013 bytes, 1 s apart). Unit 1
keeps the spec's exact bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from dlrover_events.domain.units import human_bytes
from schemas.bounds import MAX_BYTES
from schemas.envelope import Model
from schemas.jobs import OOMKind
from schemas.plans import NodeResource, ResourcePlan
from streams.brain.core.optimizers.api import (
    OptimizeContext,
    Proposal,
    group_plan,
    node_resource,
)
from streams.brain.core.optimizers.numeric import GiB, MiB, ceil_int, ceil_to, mean, median
from streams.brain.core.optimizers.usage import (
    avg_cpu,
    major_cluster,
    mean_speed,
    per_node,
    remaining_time,
    requested_cpu,
    requested_memory,
    role_count,
    role_set,
    total_cpu,
    with_role,
)
from streams.brain.core.samples import Sample
from streams.brain.core.state import PS, WORKER, JobState, Stage, parse_node_key

#: What a memory taken from the samples' use is rounded up to (see the module's docstring).
MEMORY_UNIT = 256 * MiB


def _open_ooms(state: JobState, role: str) -> list[str]:
    """Host-memory OOM events of a role not answered yet, oldest first."""
    found = []
    for key, records in state.unhandled_ooms(OOMKind.HOST_MEMORY).items():
        parsed = parse_node_key(key)
        if parsed is not None and parsed[0] == role:
            found.extend(records)
    return [r.event_id for r in sorted(found, key=lambda r: r.at)]


# -- worker create --------------------------------------------------------------------


class WorkerCreateParams(Model):
    history_days: float = Field(default=7, gt=0, le=36_500)
    margin: float = Field(default=0.5, ge=0)
    min_memory: int = Field(default=16 * GiB, ge=0)
    min_cpu: float = Field(default=12, ge=0)


def worker_create(ctx: OptimizeContext, p: WorkerCreateParams) -> Proposal | None:
    # Peaks cover a job's whole life; samples also count for hand-written history files.
    peaks: list[tuple[float, int]] = []
    for job in ctx.scenario_history(p.history_days):
        peaks.extend((pk.cpu, pk.memory) for pk in job.peaks.values() if pk.type == WORKER)
        peaks.extend((u.cpu, u.memory) for s in job.samples for u in s.usage(WORKER))
    if not peaks:
        return None
    peak_cpu = max(cpu for cpu, _ in peaks)
    peak_memory = max(memory for _, memory in peaks)
    memory = max(ceil_int(peak_memory * (1 + p.margin)), p.min_memory)
    cpu = max(ceil_int(peak_cpu), ceil_int(p.min_cpu))
    return Proposal(
        reason=(
            f"scenario history: peak worker memory {human_bytes(peak_memory)} x "
            f"{1 + p.margin:g}, peak cpu {peak_cpu:g}"
        ),
        resource=group_plan(WORKER, count=1, cpu=cpu, memory=memory),
    )


class WorkerCreateOOMParams(Model):
    history_days: float = Field(default=7, gt=0, le=36_500)
    oom_factor: float = Field(default=1.2, ge=1)
    min_increase: int = Field(default=4_000_000_000, ge=0)


def _latest_worker_memory(state: JobState) -> int:
    """The worker memory the job runs with: the last plan's, else the latest sample's
    largest worker, else what the job asked for."""
    if state.last_plan is not None:
        group = state.last_plan.resource.node_group_resources.get(WORKER)
        if group is not None and group.node_resource.memory > 0:
            return group.node_resource.memory
    for sample in reversed(state.samples):
        used = [u.memory for u in sample.usage(WORKER)]
        if used:
            return max(used)
    return state.role(WORKER).memory


def worker_create_oom(ctx: OptimizeContext, p: WorkerCreateOOMParams) -> Proposal | None:
    state = ctx.state
    ooms = _open_ooms(state, WORKER)
    if not ooms:
        return None
    from_history = 0
    for job in ctx.scenario_history(p.history_days):
        oom_nodes = job.oom_nodes()
        for key, usages in per_node(job.samples, WORKER).items():
            last = usages[-1].memory
            factor = p.oom_factor if key in oom_nodes else 1.0
            from_history = max(from_history, ceil_int(last * factor))
    latest = _latest_worker_memory(state)
    bumped = latest + p.min_increase if latest > 0 else 0
    memory = max(from_history, bumped)
    if memory <= 0:
        return None
    source = (
        "history"
        if from_history >= bumped
        else f"{human_bytes(latest)} + {human_bytes(p.min_increase)}"
    )
    return Proposal(
        reason=f"worker OOM at create: memory {human_bytes(memory)} from {source}",
        resource=group_plan(WORKER, memory=memory),
        handled_ooms=tuple(ooms),
    )


# -- PS create ------------------------------------------------------------------------


class PSCreateParams(Model):
    history_days: float = Field(default=7, gt=0, le=36_500)
    cpu_margin: float = Field(default=4, ge=0)
    total_factor: float = Field(default=1.5, gt=0)
    max_replicas: int = Field(default=15, ge=1)
    memory_factor: float = Field(default=1.2, ge=1)
    cluster_band: float = Field(default=0.2, ge=0)


def ps_create(ctx: OptimizeContext, p: PSCreateParams) -> Proposal | None:
    job_cpus: list[float] = []
    max_node_cpu = 0.0
    max_node_memory = 0
    max_total_memory = 0
    for job in ctx.scenario_history(p.history_days):
        samples = with_role(job.samples, PS)
        if not samples:
            continue
        job_cpus.append(mean(major_cluster([total_cpu(s, PS) for s in samples], p.cluster_band)))
        max_node_cpu = max(max_node_cpu, *avg_cpu(samples, PS).values())
        for sample in samples:
            used = [u.memory for u in sample.usage(PS)]
            max_node_memory = max(max_node_memory, *used)
            max_total_memory = max(max_total_memory, sum(used))
    if not job_cpus:
        return None
    avg_job_cpu = mean(job_cpus)
    cpu = ceil_int(max_node_cpu + p.cpu_margin)
    total = avg_job_cpu * p.total_factor
    replicas = max(ceil_int(total / cpu), 1)
    if replicas > p.max_replicas:
        replicas = p.max_replicas
        cpu = ceil_int(total / p.max_replicas)
    memory = ceil_int(max(max_node_memory, ceil_int(max_total_memory / replicas)) * p.memory_factor)
    return Proposal(
        reason=(
            f"history of {len(job_cpus)} job(s): average PS cpu {avg_job_cpu:g}, "
            f"busiest PS {max_node_cpu:g} cores"
        ),
        resource=group_plan(PS, count=replicas, cpu=cpu, memory=memory),
    )


class PSColdCreateParams(Model):
    replicas: int = Field(default=4, ge=1)
    cpu: float = Field(default=12, gt=0)
    memory: int = Field(default=16 * GiB, gt=0)


def ps_cold_create(ctx: OptimizeContext, p: PSColdCreateParams) -> Proposal | None:
    state = ctx.state
    if state.distribution != "ps" and PS not in state.roles:
        return None
    return Proposal(
        reason="no history for this scenario: default PS group",
        resource=group_plan(PS, count=p.replicas, cpu=p.cpu, memory=p.memory),
    )


# -- PS OOM ---------------------------------------------------------------------------


class PSOOMParams(Model):
    factor: float = Field(default=2, gt=1)
    max_memory: int = Field(default=64 * GiB, gt=0)
    imbalance: float = Field(default=0.2, ge=0)
    max_replicas: int = Field(default=15, ge=1, description="the most PS a job may have")


def ps_oom(ctx: OptimizeContext, p: PSOOMParams) -> Proposal | None:
    state = ctx.state
    ooms = _open_ooms(state, PS)
    if not ooms:
        return None
    samples = with_role(state.samples, PS)
    count = state.role(PS).replicas or role_count(state, PS)

    def doubled(count: int) -> int:  # bounded before the planner builds a node per PS
        return min(ceil_int(count * p.factor), p.max_replicas)

    if not samples:
        memories = [n.memory for n in state.alive_nodes(PS) if n.memory > 0]
        current = max(memories, default=state.role(PS).memory)
        if current <= 0:
            return None
        if current >= p.max_memory:
            if count <= 0:
                return None
            return Proposal(
                reason=(
                    f"PS OOM at {human_bytes(current)} >= {human_bytes(p.max_memory)}: "
                    f"PS count x {p.factor:g}"
                ),
                resource=group_plan(PS, count=doubled(count)),
                handled_ooms=tuple(ooms),
            )
        memory = ceil_int(current * p.factor)
        return Proposal(
            reason=f"PS OOM without samples: memory {human_bytes(current)} x {p.factor:g}",
            resource=group_plan(PS, memory=memory),
            handled_ooms=tuple(ooms),
        )
    used = [u.memory for u in samples[-1].usage(PS)]
    peak, avg = max(used), mean(used)
    if peak > 0 and (peak - avg) / peak > p.imbalance:
        return Proposal(
            reason=(
                f"PS OOM, memory imbalanced (max {human_bytes(peak)}, mean {human_bytes(avg)}): "
                f"memory x {p.factor:g}"
            ),
            resource=group_plan(PS, memory=ceil_int(peak * p.factor)),
            handled_ooms=tuple(ooms),
        )
    count = count or len(used)
    return Proposal(
        reason=(f"PS OOM, memory balanced at {human_bytes(peak)}: PS count {count} x {p.factor:g}"),
        resource=group_plan(PS, count=doubled(count)),
        handled_ooms=tuple(ooms),
    )


# -- PS init adjust -------------------------------------------------------------------


class PSInitAdjustParams(Model):
    cpu_per_recv_op: float = Field(default=0.08, ge=0)
    recv_ops_per_ps_limit: int = Field(default=150, ge=0)
    large_cpu: float = Field(default=16, gt=0)
    cpu_margin: float = Field(default=4, ge=0)
    short_job_s: float = Field(default=1800, ge=0)
    short_job_workers: int = Field(default=10, ge=1)
    target_workers: int = Field(default=32, ge=1)
    window: int = Field(default=3, ge=1, description="samples of the recent PS averages")
    max_replicas: int = Field(default=15, ge=1, description="the most PS a job may have")
    memory_factor: float = Field(default=1.2, ge=1)
    memory_unit: int = Field(
        default=MEMORY_UNIT, ge=1, le=MAX_BYTES, description="memory rounded up to it"
    )


def free_rate(ps_cpu: int, averages: Sequence[float], max_replicas: int) -> float | None:
    """How many times the current workers the PS can serve (the spec's free rate): the
    PS cpu over the busiest PS's cpu spread over the most PS a job may have, and, when one
    PS is busier than the mean of the others by `diff`, at most `ps_cpu / diff` (an
    unbalanced load lands on one PS whatever the count). None: no PS is busy, no cap."""
    busiest = max(averages, default=0.0)
    max_ps_cpu = ceil_int(busiest)
    if max_ps_cpu <= 0:
        return None
    rate = ps_cpu / (max_ps_cpu * len(averages) / max_replicas)
    if len(averages) > 1:
        others = sorted(averages)[:-1]
        diff = busiest - mean(others)
        if diff > 0:
            rate = min(rate, ps_cpu / diff)
    return rate


def ps_init_adjust(ctx: OptimizeContext, p: PSInitAdjustParams) -> Proposal | None:
    state = ctx.state
    samples = with_role(state.samples, PS)
    workers = role_count(state, WORKER)
    if not samples or workers <= 0:
        return None
    ps_count = samples[-1].count(PS)
    ps_cpu = 0
    if state.recv_op_count is not None:
        per_ps = state.recv_op_count / ps_count
        if per_ps <= p.recv_ops_per_ps_limit:
            ps_cpu = ceil_int(p.cpu_per_recv_op * per_ps) + ceil_int(p.cpu_margin)
        else:
            ps_cpu = ceil_int(p.large_cpu)
    # the PS of the latest sample, averaged over the last few samples
    latest = role_set(samples[-1], PS)
    recent = avg_cpu(samples[-p.window :], PS)
    averages = [avg for key, avg in recent.items() if _id(key) in latest]
    ps_cpu = max(ps_cpu, ceil_int(max(averages)) + ceil_int(p.cpu_margin))
    speed = mean_speed(samples)
    target = p.target_workers
    if state.total_steps is not None and speed > 0:
        job_time = state.total_steps / (speed / workers)
        if job_time <= p.short_job_s:
            target = p.short_job_workers
    rate = free_rate(ps_cpu, averages, p.max_replicas)
    capped = ""
    if rate is not None and ceil_int(rate * workers) < target:
        target = ceil_int(rate * workers)
        capped = f" (capped by free rate {rate:.3g})"
    max_sum_cpu = max(total_cpu(s, PS) for s in samples)
    if ps_cpu <= 0:  # no recv ops, idle PS and no margin: nothing to size the PS by
        return None
    replicas = min(max(ceil_int(target / workers * max_sum_cpu / ps_cpu), 1), p.max_replicas)
    peak = max(u.memory for u in samples[-1].usage(PS))
    memory = ceil_to(ceil_int(peak * p.memory_factor), p.memory_unit)
    return Proposal(
        reason=(
            f"PS for {target} workers{capped} (now {workers}): PS cpu {ps_cpu}, "
            f"peak total PS cpu {max_sum_cpu:g}"
        ),
        resource=group_plan(PS, count=replicas, cpu=ps_cpu, memory=memory),
    )


# -- hot PS and PS util (running) -----------------------------------------------------


class HotPSParams(Model):
    window: int = Field(default=3, ge=1)
    hot_util: float = Field(default=0.8, gt=0)
    target_workers: int = Field(default=32, ge=1)
    max_cpu: float = Field(default=32, gt=0)
    memory_util: float = Field(default=0.9, gt=0)
    memory_step: int = Field(default=8 * GiB, ge=0)


def hot_ps(ctx: OptimizeContext, p: HotPSParams) -> Proposal | None:
    state = ctx.state
    window = with_role(state.samples, PS)[-p.window :]
    if not window:
        return None
    latest = role_set(window[-1], PS)
    usages = {k: us for k, us in per_node(window, PS).items() if _id(k) in latest}
    averages = {key: mean(u.cpu for u in us) for key, us in usages.items()}
    requested = {key: requested_cpu(state, key, PS) for key in usages}
    hot = [k for k, avg in averages.items() if requested[k] > 0 and avg / requested[k] > p.hot_util]
    workers = role_count(state, WORKER)
    if workers > 0:
        coefficient = p.target_workers / workers
    else:
        # The original divided by zero: an infinite coefficient, which the 32-core cap
        # below shrinks to what brings the busiest hot PS to exactly 32 cores. That, not
        # infinity, is the coefficient (and with no hot PS, nothing is raised).
        busiest = max((averages[k] for k in hot), default=0.0)
        coefficient = p.max_cpu / busiest if busiest > 0 else 1.0
    for avg in averages.values():
        if avg * coefficient > p.max_cpu:
            coefficient = p.max_cpu / avg
    changes: dict[str, NodeResource] = {}
    if hot:
        for key, avg in averages.items():
            raised = min(ceil_int(avg * coefficient), ceil_int(p.max_cpu))
            if raised > requested[key]:
                changes[key] = node_resource(cpu=raised)
    full = [
        key
        for key, us in usages.items()
        if len(us) >= p.window
        and (mem := requested_memory(state, key, PS)) > 0
        and all(u.memory / mem > p.memory_util for u in us)
    ]
    for key in full:
        memory = min(requested_memory(state, key, PS) + p.memory_step, MAX_BYTES)
        changes[key] = changes.get(key, NodeResource()).model_copy(update={"memory": memory})
    if not changes:
        return None
    parts = []
    if hot:
        parts.append(f"hot PS {', '.join(sorted(hot))} (coefficient {coefficient:.3g})")
    if full:
        parts.append(f"PS memory > {p.memory_util:g} used: {', '.join(sorted(full))}")
    return Proposal(reason="; ".join(parts), resource=ResourcePlan(node_resources=changes))


def _id(key: str) -> int:
    parsed = parse_node_key(key)
    return parsed[1] if parsed is not None else -1


class PSUtilParams(Model):
    window: int = Field(default=3, ge=1)
    min_remaining_s: float = Field(default=3600, ge=0)
    many_workers: int = Field(default=32, ge=1)
    hot_util: float = Field(default=0.8, gt=0)
    max_cpu: float = Field(default=32, gt=0)
    low_util: float = Field(default=0.4, gt=0)
    cpu_margin: float = Field(default=4, ge=0)
    memory_factor: float = Field(default=1.2, ge=1)
    memory_unit: int = Field(
        default=MEMORY_UNIT, ge=1, le=MAX_BYTES, description="memory rounded up to it"
    )


def ps_util(ctx: OptimizeContext, p: PSUtilParams) -> Proposal | None:
    state = ctx.state
    remaining = remaining_time(state)
    window = with_role(state.samples, PS)[-p.window :]
    if remaining is None or remaining < p.min_remaining_s or not window:
        return None
    usages = per_node(window, PS)
    averages = {key: mean(u.cpu for u in us) for key, us in usages.items()}
    utils = {
        key: averages[key] / req for key in usages if (req := requested_cpu(state, key, PS)) > 0
    }
    workers = role_count(state, WORKER)
    pressed = (workers >= p.many_workers and max(utils.values(), default=0) > p.hot_util) or any(
        avg >= p.max_cpu * p.hot_util for avg in averages.values()
    )
    if not pressed:
        return None
    changes: dict[str, NodeResource] = {}
    for key, util in utils.items():
        if util >= p.low_util:
            continue
        cpu = ceil_int(max(u.cpu for u in usages[key]) + p.cpu_margin)
        memory = ceil_to(ceil_int(usages[key][-1].memory * p.memory_factor), p.memory_unit)
        if cpu != requested_cpu(state, key, PS) or memory != requested_memory(state, key, PS):
            changes[key] = node_resource(cpu=cpu, memory=memory)
    if not changes:
        return None
    return Proposal(
        reason=f"PS under {p.low_util:g} used shrink: {', '.join(sorted(changes))}",
        resource=ResourcePlan(node_resources=changes),
    )


# -- worker resource ------------------------------------------------------------------


class WorkerResourceParams(Model):
    exhausted_util: float = Field(default=0.95, gt=0)
    target_util: float = Field(default=0.8, gt=0)
    step: int = Field(default=1, ge=1, le=4)
    short_job_s: float = Field(default=1800, ge=0)
    short_job_workers: int = Field(default=10, ge=1)
    max_initial_workers: int = Field(default=32, ge=1)
    max_step_up: int = Field(default=4, ge=1)
    max_workers: int = Field(default=60, ge=1)
    cpu_margin: float = Field(default=1, ge=0)
    memory_margin: float = Field(default=0.2, ge=0)
    memory_margin_cap: int = Field(default=8 * GiB, ge=0)
    memory_unit: int = Field(
        default=MEMORY_UNIT, ge=1, le=MAX_BYTES, description="memory rounded up to it"
    )
    speed_window: int = Field(default=5, ge=1)
    deceleration: float = Field(default=0.1, ge=0, lt=1)
    spike_factor: float = Field(default=2.0, gt=1)


def speed_trend(samples: list[Sample], window: int, deceleration: float) -> str:
    """'decelerated', 'increased' or 'unknown': mean speed of the `window` samples before
    vs after the last change of the worker count."""
    change = next(
        (
            i
            for i in range(len(samples) - 1, 0, -1)
            if samples[i].count(WORKER) != samples[i - 1].count(WORKER)
        ),
        None,
    )
    if change is None:
        return "unknown"
    before = mean_speed(samples[max(change - window, 0) : change])
    after = mean_speed(samples[change : change + window])
    if before <= 0 or after <= 0:
        return "unknown"
    if after <= before * (1 - deceleration):
        return "decelerated"
    return "increased" if after > before else "unknown"


def _stable_samples(samples: list[Sample], spike_factor: float) -> list[Sample]:
    """Samples of the current PS set without PS-cpu spikes: a PS change or a spike says
    nothing about the worker count the PS can serve."""
    latest = role_set(samples[-1], PS)
    same = [s for s in samples if role_set(s, PS) == latest]
    if not latest:
        return same
    typical = median(total_cpu(s, PS) for s in same)
    return [s for s in same if typical <= 0 or total_cpu(s, PS) <= spike_factor * typical]


def worker_resource(ctx: OptimizeContext, p: WorkerResourceParams) -> Proposal | None:
    state = ctx.state
    samples = with_role(state.samples, WORKER)
    if not samples:
        return None
    stable = _stable_samples(samples, p.spike_factor) or samples
    last = stable[-3:]
    per_sample_max = [max(u.cpu for u in s.usage(WORKER)) for s in last]
    busiest = max(per_sample_max) if len(stable) < 6 else mean(per_sample_max)
    cpu = ceil_int(busiest + p.cpu_margin)
    peak_memory = max(u.memory for s in stable for u in s.usage(WORKER))
    margin = ceil_int(min(p.memory_margin * peak_memory, p.memory_margin_cap))
    memory = ceil_to(peak_memory + margin, p.memory_unit)
    current = samples[-1].count(WORKER)
    replicas = current
    why = (
        f"worker cpu {cpu} from use {busiest:g}, memory {human_bytes(memory)} "
        f"from peak {human_bytes(peak_memory)}"
    )
    ps_window = with_role(last, PS)
    if ps_window:
        utils = [
            avg / req
            for key, avg in avg_cpu(ps_window, PS).items()
            if (req := requested_cpu(state, key, PS)) > 0
        ]
        top = max(utils, default=0.0)
        trend = speed_trend(state.samples, p.speed_window, p.deceleration)
        if top > p.exhausted_util:
            replicas = current - p.step
            why += f"; PS exhausted ({top:.2f}): {p.step} worker(s) fewer"
        elif 0 < top < p.target_util and trend != "decelerated":
            wanted = ceil_int(p.target_util / top * current)
            if state.stage == Stage.WORKER_INITIAL:
                speed = mean_speed(samples)
                job_time = (
                    state.total_steps / (speed / current)
                    if state.total_steps is not None and speed > 0 and current > 0
                    else None
                )
                short = job_time is not None and job_time <= p.short_job_s
                replicas = p.short_job_workers if short else min(p.max_initial_workers, wanted)
            elif trend == "increased":
                replicas = current + min(p.max_step_up, max(wanted - current, 0))
            why += f"; PS used {top:.2f}, speed {trend}: {replicas} worker(s)"
    replicas = min(max(replicas, 1), p.max_workers)
    count = replicas if replicas != current else 0
    return Proposal(reason=why, resource=group_plan(WORKER, count=count, cpu=cpu, memory=memory))


__all__ = [
    "hot_ps",
    "ps_cold_create",
    "ps_create",
    "ps_init_adjust",
    "ps_oom",
    "ps_util",
    "speed_trend",
    "worker_create",
    "worker_create_oom",
    "worker_resource",
]
