"""Readings of a job's runtime samples that several optimizers share."""

from __future__ import annotations

from collections.abc import Sequence

from streams.brain.core.optimizers.numeric import mean, median
from streams.brain.core.sample_structs import NodeUse
from streams.brain.core.samples import Sample
from streams.brain.core.state import JobState, node_key


def with_role(samples: Sequence[Sample], role: str) -> list[Sample]:
    return [s for s in samples if any(n.type == role for n in s.nodes)]


def role_count(state: JobState, role: str) -> int:
    """Replicas of a role now: what the latest sample saw, else the nodes the brain knows
    alive, else what the job asked for."""
    for sample in reversed(state.samples):
        count = sample.count(role)
        if count:
            return count
    alive = state.alive_nodes(role)
    return len(alive) if alive else state.role(role).replicas


def per_node(samples: Sequence[Sample], role: str) -> dict[str, list[NodeUse]]:
    found: dict[str, list[NodeUse]] = {}
    for sample in samples:
        for usage in sample.usage(role):
            found.setdefault(node_key(usage.type, usage.id), []).append(usage)
    return found


def avg_cpu(samples: Sequence[Sample], role: str) -> dict[str, float]:
    return {key: mean(u.cpu for u in us) for key, us in per_node(samples, role).items()}


def requested_cpu(state: JobState, key: str, role: str) -> float:
    node = state.nodes.get(key)
    return node.cpu if node is not None and node.cpu > 0 else state.role(role).cpu


def requested_memory(state: JobState, key: str, role: str) -> int:
    node = state.nodes.get(key)
    return node.memory if node is not None and node.memory > 0 else state.role(role).memory


def role_set(sample: Sample, role: str) -> frozenset[int]:
    return frozenset(u.id for u in sample.usage(role))


def total_cpu(sample: Sample, role: str) -> float:
    return sum(u.cpu for u in sample.usage(role))


def major_cluster(values: Sequence[float], band: float) -> list[float]:
    """Values within `band` (a fraction) of the median: DLRover's way of ignoring the
    start-up and spike samples when averaging a job's PS cpu."""
    if not values:
        return []
    mid = median(values)
    if mid <= 0:
        return list(values)
    return [v for v in values if abs(v - mid) <= band * mid] or list(values)


def mean_speed(samples: Sequence[Sample]) -> float:
    return mean(s.speed for s in samples if s.speed > 0)


def remaining_time(state: JobState) -> float | None:
    """Seconds left at the recent speed; None when the job's length or speed is unknown."""
    if state.total_steps is None or not state.samples:
        return None
    speed = mean_speed(state.samples[-5:])
    if speed <= 0:
        return None
    return max(state.total_steps - state.samples[-1].global_step, 0) / speed
