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

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from streams.brain.core.schedulers.goodput import BatchChoice, Grids, JobModel


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


class SizeMenu:
    """The sizes of a round's cluster, built once: each job's table takes the run of them
    within its limits (a slice, not a filtered copy per job)."""

    __slots__ = ("by_size", "sizes")

    def __init__(self, candidates: Iterable[Shape]) -> None:
        self.by_size = {s.replicas: s for s in candidates}
        self.sizes = sorted(self.by_size)

    def within(self, least: int, most: int | None) -> list[int]:
        lo = bisect.bisect_left(self.sizes, least)
        hi = len(self.sizes) if most is None else bisect.bisect_right(self.sizes, most)
        return self.sizes[lo:hi]


class SpeedupTable:
    """One job's best batch and speedup at each size it may have, computed when first
    asked: a round with many jobs visits only a few sizes of each (the greedy search
    stops at the first size worth more than the current one, and at the GPUs left), and
    the batch search is what a round spends its time on. Local to one round: nothing is
    shared between calls but what the round passes in (its sizes, its batch grids).
    """

    __slots__ = ("_base", "_choices", "_fair", "_grids", "_model", "_shapes", "sizes")

    def __init__(
        self,
        model: JobModel,
        candidates: SizeMenu | Iterable[Shape],
        fair: int,
        grids: Grids | None = None,
    ) -> None:
        menu = candidates if isinstance(candidates, SizeMenu) else SizeMenu(candidates)
        lim = model.limits
        self._model = model
        self._fair = fair
        self._grids = grids
        self._shapes = menu.by_size
        #: sizes within the job's limits, ascending; one may still fit no batch (choice None)
        self.sizes: list[int] = menu.within(lim.min_replicas, lim.max_replicas)
        self._choices: dict[int, tuple[Shape, BatchChoice] | None] = {}
        self._base: float | None = None

    def choice(self, replicas: int) -> tuple[Shape, BatchChoice] | None:
        """The shape and best batch at `replicas`; None when the job cannot have it."""
        if replicas in self._choices:
            return self._choices[replicas]
        lim = self._model.limits
        shape = self._shapes.get(replicas)
        if (
            shape is None
            or replicas < lim.min_replicas
            or (lim.max_replicas is not None and replicas > lim.max_replicas)
        ):
            got = None
        else:
            best = self._model.best_batch(shape.nodes, replicas, self._grids)
            got = None if best is None else (shape, best)
        self._choices[replicas] = got
        return got

    @property
    def base_goodput(self) -> float:
        """The best goodput within a fair share, else at the smallest usable size;
        0 when no size is usable."""
        if self._base is None:
            within = [c[1].goodput for r in self.sizes if r <= self._fair and (c := self.choice(r))]
            if within:
                self._base = max(within)
            else:
                first = next((c for r in self.sizes if (c := self.choice(r))), None)
                self._base = first[1].goodput if first else 0.0
        return self._base

    def speedup(self, replicas: int) -> float:
        """Goodput at `replicas` over the base; 0 for no GPUs or a size it cannot have."""
        got = self.choice(replicas) if replicas else None
        if got is None or self.base_goodput <= 0:
            return 0.0
        return got[1].goodput / self.base_goodput


def speedup_table(
    model: JobModel,
    candidates: SizeMenu | Iterable[Shape],
    fair: int,
    grids: Grids | None = None,
) -> SpeedupTable | None:
    """The job's speedups relative to its best goodput within a fair share of `fair`
    GPUs (or at its smallest usable size when that is above the fair share); None when
    no size fits its limits."""
    table = SpeedupTable(model, candidates, fair, grids)
    return table if table.base_goodput > 0 else None


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
    "SizeMenu",
    "SpeedupTable",
    "fair_share",
    "power_mean",
    "restart_factor",
    "shapes",
    "speedup_table",
    "utility",
]
