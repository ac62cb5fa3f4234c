"""Optimizers for GPU all-reduce jobs, where DLRover's PS-centred algorithms say little.

- goodput: fits the job's own step-time model from its samples (Pollux-style) and picks
  the worker count with the most goodput whose per-GPU efficiency stays acceptable;
- gpu-oom: a GPU OOM is fixed by a smaller micro-batch with more gradient accumulation
  (the global batch, hence convergence, unchanged), and only then by bigger GPUs;
- host-oom: per-node memory bumps, only for nodes that ran out of memory, once per OOM;
- straggler: replaces a node whose step time is an outlier in every recent sample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from msgspec import Struct
from pydantic import Field

from dlrover_events.domain.units import human_bytes
from schemas.envelope import Model
from schemas.jobs import OOMKind
from schemas.plans import NodeGroupResource, NodeResource, ResourcePlan
from streams.brain.core.memo import DerivedSeries, SampleMemo, derived, series
from streams.brain.core.optimizers.api import OptimizeContext, Proposal, node_resource
from streams.brain.core.optimizers.fit import nnls
from streams.brain.core.optimizers.numeric import GiB, ceil_int, median
from streams.brain.core.samples import Sample
from streams.brain.core.state import WORKER, JobState, NodeStatus, node_key, parse_node_key

# -- goodput --------------------------------------------------------------------------


class GoodputParams(Model):
    role: str = WORKER
    min_samples: int = Field(default=3, ge=1)
    min_efficiency: float = Field(
        default=0.5, gt=0, le=1, description="goodput per GPU relative to one replica"
    )
    min_gain: float = Field(default=0.05, ge=0, description="relative gain worth a change")
    noise_scale: float | None = Field(
        default=None, gt=0, description="gradient noise scale (samples); None: ignore"
    )
    explore: bool = Field(default=True, description="grow to learn when one scale is known")
    max_workers: int = Field(default=60, ge=1)


class StepObservation(Struct, frozen=True, gc=False):
    """One sample's step time at its scale. A struct: a job's memo keeps one per sample
    (a frozen dataclass took a microsecond more to make), and the collector never walks
    them."""

    replicas: int
    gpus: int
    local_batch: int
    accumulation: int
    step_time: float


@dataclass(frozen=True)
class ThroughputModel:
    """t(n) = alpha * k + beta * b * k + gamma * log2(gpus): per-micro-step overhead,
    per-sample compute, and an all-reduce term growing with the ring/tree depth."""

    alpha: float
    beta: float
    gamma: float

    def step_time(self, gpus: int, local_batch: int, accumulation: int) -> float:
        return (
            self.alpha * accumulation
            + self.beta * local_batch * accumulation
            + self.gamma * math.log2(max(gpus, 1))
        )


def _gpus_per_replica(state: JobState, role: str) -> int:
    return max(state.role(role).gpu_num, 1)


#: What of a job's state an observation's local batch falls back to when its sample does
#: not say it: the local batch the job was told (None unless a positive int), its global
#: batch.
BatchKnown = tuple[int | None, int | None]


def _batch_known(state: JobState) -> BatchKnown:
    known = state.training.get("local_batch_size")
    return (known if isinstance(known, int) and known > 0 else None), state.batch_size


def _local_batch_of(sample: Sample, replicas: int, known: BatchKnown) -> int:
    if sample.local_batch_size is not None:
        return sample.local_batch_size
    local, global_batch = known
    if local is not None:
        return local
    batch = sample.batch_size or global_batch
    per_replica = replicas * sample.accumulation_steps
    if batch is not None and per_replica > 0 and batch % per_replica == 0:
        return batch // per_replica
    return 1  # unknown: throughput is then counted in replica-steps, which still ranks n


def _local_batch(state: JobState, sample: Sample, replicas: int) -> int:
    return _local_batch_of(sample, replicas, _batch_known(state))


def _step_time(sample: Sample, role: str) -> tuple[int, float] | None:
    """A sample's replicas of `role` and its step time: the median of theirs, else the
    sample's own speed; None when it says neither."""
    # one pass over the nodes themselves: `usage(role)` would memoize them by role first
    replicas = 0
    times: list[float] = []
    for u in sample.nodes:
        if u.type == role:
            replicas += 1
            t = u.step_time
            if t is not None and t > 0:
                times.append(t)
    if not replicas:
        return None
    if sample.world_size is not None and sample.world_size > replicas:
        # One process of an elastic job reports only itself; the world it trained in
        # that step is what its step time was measured at.
        replicas = sample.world_size
    if times:
        return replicas, median(times)
    if sample.speed > 0:
        return replicas, 1 / sample.speed
    return None


#: What an observation depends on besides its sample: the role, GPUs per replica, and
#: what the job's state says of the batch (`BatchKnown`).
ObserveArgs = tuple[str, int, BatchKnown]


def _seen(sample: Sample, args: ObserveArgs) -> StepObservation | None:
    """The sample's step time at the scale and batch it ran with; None when it says
    nothing of the step time."""
    role, per_gpu, known = args
    step = _step_time(sample, role)
    if step is None:
        return None
    replicas, step_time = step
    return StepObservation(
        replicas,
        replicas * per_gpu,
        _local_batch_of(sample, replicas, known),
        sample.accumulation_steps,
        step_time,
    )


def _gpus(observation: StepObservation) -> int:
    return observation.gpus


def observed(
    state: JobState, role: str, memo: SampleMemo | None = None
) -> DerivedSeries[StepObservation, int]:
    """The observation of each sample that says its step time, in order, and how many
    were made at each number of GPUs; through the job's `memo` (read, never change)."""
    args = (role, _gpus_per_replica(state, role), _batch_known(state))
    return series(memo, "goodput", args, state.samples, _seen, _gpus)


def observations(
    state: JobState, role: str, memo: SampleMemo | None = None
) -> Sequence[StepObservation]:
    """The step time of each sample that says it, at the scale and batch it ran with."""
    return observed(state, role, memo).values


def fit_throughput(obs: Sequence[StepObservation]) -> ThroughputModel | None:
    coef = nnls(
        [[o.accumulation, o.local_batch * o.accumulation, math.log2(max(o.gpus, 1))] for o in obs],
        [o.step_time for o in obs],
    )
    return None if coef is None else ThroughputModel(*coef)


def goodput(ctx: OptimizeContext, p: GoodputParams) -> Proposal | None:
    state = ctx.state
    spec = state.role(p.role)
    per_gpu = _gpus_per_replica(state, p.role)
    seen = observed(state, p.role, ctx.memo)
    obs = seen.values
    if len(obs) < p.min_samples:
        return None
    latest = obs[-1]
    current = latest.replicas
    lo = max(spec.min_replicas or 1, 1)
    hi = min(spec.max_replicas or p.max_workers, p.max_workers)
    if ctx.free_gpus is not None:
        hi = min(hi, current + max(ctx.free_gpus, 0) // per_gpu)
    if hi < lo:
        return None
    if len(seen.counts) < 2:  # observed at one number of GPUs only
        if not p.explore or current >= hi:
            return None
        target = min(hi, max(current + 1, current * 2))
        return Proposal(
            reason=f"step time known at {current} worker(s) only: explore {target}",
            resource=_count(p.role, target),
        )
    model = fit_throughput(obs)
    if model is None:
        return None
    b, k = latest.local_batch, latest.accumulation
    global_now = current * b * k

    def goodput_at(n: int) -> float | None:
        t = model.step_time(n * per_gpu, b, k)
        if t <= 0:
            return None
        throughput = n * b * k / t
        if p.noise_scale is None:
            return throughput
        return throughput * (p.noise_scale + global_now) / (p.noise_scale + n * b * k)

    single = goodput_at(1)
    if single is None:
        return None
    per_gpu_single = single / per_gpu
    scores: dict[int, float] = {}
    for n in range(lo, hi + 1):
        g = goodput_at(n)
        if g is not None and g / (n * per_gpu) >= p.min_efficiency * per_gpu_single:
            scores[n] = g
    if not scores:
        return None
    best = max(scores, key=lambda n: (scores[n], -n))
    if best == current:
        return None
    now_score = scores.get(current)
    if now_score is not None and scores[best] < now_score * (1 + p.min_gain):
        return None
    efficiency = scores[best] / (best * per_gpu) / per_gpu_single
    return Proposal(
        reason=(
            f"fitted t = {model.alpha:.3g}k + {model.beta:.3g}bk + {model.gamma:.3g}log2(gpus) "
            f"over {len(obs)} samples: {best} worker(s) give {scores[best]:.4g} samples/s "
            f"at {efficiency:.0%} per-GPU efficiency (now {current})"
        ),
        resource=_count(p.role, best),
    )


def _count(role: str, count: int) -> ResourcePlan:
    return ResourcePlan(node_group_resources={role: NodeGroupResource(count=count)})


# -- GPU OOM --------------------------------------------------------------------------


class GPUOOMParams(Model):
    min_local_batch: int = Field(default=1, ge=1)
    gpu_memory_factor: float = Field(default=1.5, gt=1)
    max_gpu_memory: int = Field(default=80 * GiB, gt=0)


def smaller_micro_batch(local_batch: int, accumulation: int, floor: int) -> tuple[int, int] | None:
    """The largest micro-batch at most half the current one that divides the samples per
    replica per step, so the global batch stays exactly the same."""
    per_step = local_batch * accumulation
    for size in range(local_batch // 2, floor - 1, -1):
        if size >= 1 and per_step % size == 0:
            return size, per_step // size
    return None


def gpu_oom(ctx: OptimizeContext, p: GPUOOMParams) -> Proposal | None:
    state = ctx.state
    open_ = state.unhandled_ooms(OOMKind.GPU_MEMORY)
    if not open_:
        return None
    handled = tuple(r.event_id for rs in open_.values() for r in rs)
    latest = state.samples[-1] if state.samples else None
    raw_batch = state.training.get("local_batch_size")
    if latest is not None and latest.local_batch_size is not None:
        raw_batch = latest.local_batch_size
    raw_acc = state.training.get("accumulation_steps", 1)
    accumulation = raw_acc if isinstance(raw_acc, int) and raw_acc >= 1 else 1
    if isinstance(raw_batch, int) and raw_batch > 0:
        smaller = smaller_micro_batch(raw_batch, accumulation, p.min_local_batch)
        if smaller is not None:
            size, steps = smaller
            return Proposal(
                reason=(
                    f"GPU OOM on {', '.join(sorted(open_))}: micro-batch {raw_batch} -> {size}, "
                    f"accumulation {accumulation} -> {steps} (global batch unchanged)"
                ),
                resource=ResourcePlan(
                    training={"local_batch_size": size, "accumulation_steps": steps}
                ),
                handled_ooms=handled,
            )
    seen_by_role: dict[str, int] = {}
    for key, records in open_.items():
        parsed = parse_node_key(key)
        if parsed is not None:
            seen = max((r.gpu_memory or 0 for r in records), default=0)
            seen_by_role[parsed[0]] = max(seen_by_role.get(parsed[0], 0), seen)
    groups: dict[str, NodeGroupResource] = {}
    for role, seen in sorted(seen_by_role.items()):
        current = state.role(role).gpu_memory or seen
        if current <= 0:
            continue
        wanted = min(ceil_int(current * p.gpu_memory_factor), p.max_gpu_memory)
        if wanted > current:
            groups[role] = NodeGroupResource(node_resource=node_resource(gpu_memory=wanted))
    if not groups:
        return None
    return Proposal(
        reason=f"GPU OOM at the smallest micro-batch: more GPU memory for {', '.join(groups)}",
        resource=ResourcePlan(node_group_resources=groups),
        handled_ooms=handled,
    )


# -- host OOM -------------------------------------------------------------------------


class HostOOMParams(Model):
    factor: float = Field(default=2, gt=1, description="a host OOM doubles the node's memory")
    min_increase: int = Field(default=2 * GiB, ge=0)
    max_step: int = Field(default=8 * GiB, gt=0, description="one bump is at most this")
    max_memory: int = Field(default=64 * GiB, gt=0)
    max_relaunches: int = Field(default=5, ge=0)


def host_oom(ctx: OptimizeContext, p: HostOOMParams) -> Proposal | None:
    state = ctx.state
    limit = min(state.restart_count, p.max_relaunches)
    changes: dict[str, NodeResource] = {}
    handled: list[str] = []
    skipped: list[str] = []
    for key, records in sorted(state.unhandled_ooms(OOMKind.HOST_MEMORY).items()):
        parsed = parse_node_key(key)
        if parsed is None:
            continue
        role, _ = parsed
        node = state.nodes.get(key)
        current = (node.memory if node is not None else 0) or state.role(role).memory
        current = current or max((r.memory or 0 for r in records), default=0)
        relaunches = node.relaunches if node is not None else 0
        if current <= 0 or current >= p.max_memory or relaunches >= limit:
            skipped.append(key)
            continue
        step = min(max(ceil_int(current * (p.factor - 1)), p.min_increase), p.max_step)
        changes[key] = node_resource(memory=min(current + step, p.max_memory))
        handled.extend(r.event_id for r in records)
    if not changes:
        return None
    reason = "host OOM: " + ", ".join(f"{k} -> {human_bytes(r.memory)}" for k, r in changes.items())
    if skipped:
        reason += f"; not raised (at cap or relaunch limit): {', '.join(skipped)}"
    return Proposal(
        reason=reason,
        resource=ResourcePlan(node_resources=changes),
        handled_ooms=tuple(handled),
    )


# -- straggler ------------------------------------------------------------------------


class StragglerParams(Model):
    role: str = WORKER
    window: int = Field(default=3, ge=1, description="an outlier in each of this many samples")
    k: float = Field(default=3.0, gt=0, description="outlier: step time > median + k * MAD")
    min_ratio: float = Field(default=0.2, ge=0, description="and > median x (1 + min_ratio)")
    min_nodes: int = Field(default=3, ge=3)


#: (role, k, min_ratio, min_nodes): what of StragglerParams a sample's outliers depend on
OutlierArgs = tuple[str, float, float, int]


def _outliers(sample: Sample, args: OutlierArgs) -> dict[str, float] | bool:
    """The sample's outliers, by node; False when the sample has no node of the role,
    True when too few of them say their step time to tell."""
    role, k, min_ratio, min_nodes = args
    # one pass over the nodes themselves, as `usage(role)` lists them; by id, which
    # names a node as its key does (a node listed twice counts once, at its last time)
    seen = False
    times: dict[int, float] = {}
    for u in sample.nodes:
        if u.type == role:
            seen = True
            if u.step_time is not None:
                times[u.id] = u.step_time
    if not seen:
        return False
    if len(times) < min_nodes:
        return True
    ordered = sorted(times.values())
    mid = median(ordered)
    mad = median([abs(t - mid) for t in ordered])  # the same deviations, in another order
    above, over = mid + k * mad, mid * (1 + min_ratio)
    if not ordered or ordered[-1] <= above or ordered[-1] <= over:
        return {}  # not even the slowest node: the usual answer
    return {node_key(role, node_id): t for node_id, t in times.items() if t > above and t > over}


def find_stragglers(
    state: JobState, p: StragglerParams, memo: SampleMemo | None = None
) -> dict[str, float]:
    """Nodes slow in every one of the last `window` samples, with their latest step time.

    Requiring every sample keeps a node that was just replaced (fast now) from being
    replaced again on the strength of its old samples. The router asks at every decision
    of a running job, and the straggler optimizer again: a sample's outliers are made
    once, through the job's `memo`.
    """
    args = (p.role, p.k, p.min_ratio, p.min_nodes)
    samples = state.samples
    # newest first, so that the usual answer (no outlier in the newest sample) costs the
    # newest sample's outliers alone; the times kept are the newest sample's
    common: dict[str, float] | None = None
    window = 0
    for s in reversed(samples):
        slow = derived(memo, "outliers", args, s, _outliers)
        if slow is False:
            continue  # no node of the role: not one of the window's samples
        if slow is True:
            return {}  # too few step times to tell
        common = slow if common is None else {k: t for k, t in common.items() if k in slow}
        if not common:
            return {}
        window += 1
        if window == p.window:
            break
    else:
        return {}  # fewer than `window` samples with the role
    alive = {
        key: t
        for key, t in common.items()
        if (node := state.nodes.get(key)) is None or node.status == NodeStatus.RUNNING
    }
    return dict(sorted(alive.items()))


def straggler(ctx: OptimizeContext, p: StragglerParams) -> Proposal | None:
    slow = find_stragglers(ctx.state, p, ctx.memo)
    if not slow:
        return None
    # An all-default NodeResource asks the planner to relaunch the node as it is.
    return Proposal(
        reason="stragglers replaced: "
        + ", ".join(f"{k} ({t:.3g} s/step)" for k, t in slow.items()),
        resource=ResourcePlan(node_resources={key: NodeResource() for key in slow}),
    )
