"""Speedup over a fair share, the fairness objective and the restart penalty.

Goodputs of different jobs are not comparable (an NCF sample is not a BERT sample), so
each job's goodput is divided by what it would make on a fair share of the cluster
(GPUs / jobs): a speedup of 1 is "as good as equal shares". Summing speedups would
starve jobs that scale badly, so the cluster's objective is their power mean with p = -1
(Pollux's choice: a harmonic mean, which a job near 0 pulls down hard). A job that
changes its allocation loses a restart's worth of time, weighted as Pollux does by how
long it has lived and how often it restarted already.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from streams.brain.schedulers.goodput import BatchChoice, JobModel


@dataclass(frozen=True, slots=True)
class Shape:
    """A size a job may have: replicas (one GPU each) on that many nodes."""

    replicas: int
    nodes: int


def shapes(gpus_per_node: int, largest_node: int, whole_nodes: int) -> list[Shape]:
    """Every size the whole-node rule allows: 1..(GPUs of the largest node) on one node,
    or k whole nodes (k >= 2) of `gpus_per_node` GPUs; ascending."""
    out = [Shape(r, 1) for r in range(1, min(gpus_per_node, largest_node) + 1)]
    out.extend(Shape(k * gpus_per_node, k) for k in range(2, whole_nodes + 1))
    return out


def fair_share(total_gpus: int, jobs: int) -> int:
    """GPUs per job were they shared equally (at least one)."""
    return max(1, math.ceil(total_gpus / max(jobs, 1)))


@dataclass(frozen=True, slots=True)
class SpeedupTable:
    """One job's best batch and speedup at each size it may have (sizes it cannot use,
    for its limits or its batch, are absent)."""

    base_goodput: float
    choices: dict[int, tuple[Shape, BatchChoice]]

    def speedup(self, replicas: int) -> float:
        if replicas == 0:
            return 0.0
        return self.choices[replicas][1].goodput / self.base_goodput

    @property
    def sizes(self) -> list[int]:
        return sorted(self.choices)


def speedup_table(model: JobModel, candidates: Iterable[Shape], fair: int) -> SpeedupTable | None:
    """The job's speedups relative to its best goodput within a fair share of `fair`
    GPUs (or at its smallest usable size when that is above the fair share); None when
    no size fits its limits."""
    lim = model.limits
    choices: dict[int, tuple[Shape, BatchChoice]] = {}
    for shape in candidates:
        if shape.replicas < lim.min_replicas:
            continue
        if lim.max_replicas is not None and shape.replicas > lim.max_replicas:
            continue
        best = model.best_batch(shape.nodes, shape.replicas)
        if best is not None:
            choices[shape.replicas] = (shape, best)
    if not choices:
        return None
    within = [c.goodput for r, (_, c) in choices.items() if r <= fair]
    base = max(within) if within else choices[min(choices)][1].goodput
    return SpeedupTable(base, choices)


def restart_factor(age_s: float, restarts: int, restart_cost_s: float) -> float:
    """The share of a job's life left for training after one more restart:
    max(age - restarts x cost, 0) / (age + cost). Young or often restarted jobs get a low
    factor, so the scheduler leaves them alone unless moving them pays much more."""
    if restart_cost_s <= 0:
        return 1.0
    return max(age_s - restarts * restart_cost_s, 0.0) / (max(age_s, 0.0) + restart_cost_s)


def utility(value: float, p: float, epsilon: float) -> float:
    """A job's term of the power mean, such that the sum of terms rises exactly when the
    power mean does: (v + eps)^p / p (log for p = 0). `epsilon` keeps a job without
    GPUs finite (and, with p < 0, very costly)."""
    x = value + epsilon
    if p == 0:
        return math.log(x)
    return x**p / p


def power_mean(values: Sequence[float], p: float, epsilon: float) -> float:
    """((sum (v + eps)^p) / n)^(1/p); the geometric mean for p = 0; 0 without values."""
    if not values:
        return 0.0
    if p == 0:
        return math.exp(sum(math.log(v + epsilon) for v in values) / len(values))
    return (sum((v + epsilon) ** p for v in values) / len(values)) ** (1 / p)


__all__ = [
    "Shape",
    "SpeedupTable",
    "fair_share",
    "power_mean",
    "restart_factor",
    "shapes",
    "speedup_table",
    "utility",
]
