"""One job's goodput: how many useful samples per second it makes at an allocation.

A cluster scheduler compares allocations across jobs, so it needs, per job, more than a
step time: a larger batch trains faster in samples per second but each sample is worth
less once the batch passes the gradient noise scale. Goodput = throughput x statistical
efficiency (Pollux, OSDI'21), both from what the job reported:

- throughput from a fitted step-time model that splits a step into compute (per
  micro-step, linear in the local batch) and all-reduce (a constant plus a term growing
  with the replicas past 2, with other constants once the job spans nodes), combined with
  an overlap exponent gamma (1: none, large: the slower of the two); the model and its
  fit live in dlrover_events.domain.step_time, which the simulator shares;
- efficiency from the gradient statistics (`grad_sqr`, `grad_var`, or the gradient noise
  scale): relative to the job's initial batch, E(B) = (gns + B0) / (gns + B).

Everything is a pure function of frozen inputs, so a scheduling tick can be replayed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from dlrover_events.domain.step_time import (
    PerfParams,
    StepSample,
    finite_non_negative,
    fit_perf_params,
)

#: Candidate global batches tried per allocation when the batch may adapt: a geometric
#: grid, as Pollux samples it; the grid is over whole samples per replica, deduplicated.
BATCH_GRID = 50


class StepTimeModel(Protocol):
    """Seconds per optimizer step of a data-parallel job."""

    def step_time(self, nodes: int, replicas: int, local_batch: int, accumulation: int) -> float:
        """`accumulation` micro-steps of `local_batch` samples per replica, then one
        all-reduce across `replicas` on `nodes` nodes."""
        ...


@dataclass(frozen=True, slots=True)
class GradStats:
    """The gradient's squared norm and variance at the initial batch (AdaScale's
    statistics); their ratio is the gradient noise scale: gns = B0 * var / sqr."""

    sqr: float
    var: float

    def __post_init__(self) -> None:
        finite_non_negative("grad_sqr", self.sqr)
        finite_non_negative("grad_var", self.var)

    @classmethod
    def from_noise_scale(cls, noise_scale: float, init_batch: int) -> GradStats:
        """The same efficiency from a gradient noise scale in samples."""
        finite_non_negative("gradient noise scale", noise_scale)
        return cls(sqr=1.0, var=noise_scale / init_batch)


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """What a job allows of its batch and its size, as its submission says.

    `init_batch` is the global batch the job was tuned at (efficiency 1); an adaptive job
    may grow it up to `max_batch`. A local batch stays within [min_local, max_local] (what
    fits on a GPU); past max_local, `accumulation` lets a replica take several
    micro-steps per optimizer step.
    """

    init_batch: int
    max_batch: int
    min_local: int = 1
    max_local: int | None = None
    adaptive: bool = True
    accumulation: bool = True
    min_replicas: int = 1
    max_replicas: int | None = None

    def __post_init__(self) -> None:
        if self.init_batch < 1:
            raise ValueError(f"init_batch must be >= 1, got {self.init_batch}")
        if self.max_batch < self.init_batch:
            raise ValueError(
                f"max_batch ({self.max_batch}) must be >= init_batch ({self.init_batch})"
            )
        if self.min_local < 1:
            raise ValueError(f"min_local must be >= 1, got {self.min_local}")
        if self.max_local is not None and self.max_local < self.min_local:
            raise ValueError(
                f"max_local ({self.max_local}) must be >= min_local ({self.min_local})"
            )
        if self.min_replicas < 1:
            raise ValueError(f"min_replicas must be >= 1, got {self.min_replicas}")
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})"
            )

    @property
    def local_cap(self) -> int:
        return self.max_local if self.max_local is not None else self.max_batch


@dataclass(frozen=True, slots=True)
class BatchChoice:
    """The best batch of a job at one allocation, and what it is worth."""

    local_batch: int
    accumulation: int
    global_batch: int
    throughput: float  # samples per second
    efficiency: float  # statistical efficiency of the global batch, 1 at init_batch
    goodput: float  # throughput x efficiency: init-batch-equivalent samples per second


@dataclass(frozen=True, slots=True)
class JobModel:
    """What the scheduler knows of one job: its step-time model, its gradient statistics
    (None: unknown, so its batch stays the initial one), its limits."""

    perf: StepTimeModel
    grad: GradStats | None
    limits: BatchLimits

    def efficiency(self, global_batch: int) -> float:
        """E(B) = gain / scale with scale = B / B0 and AdaScale's gain
        (var + sqr) / (var / scale + sqr): 1 at B0, falling towards B0 / B as the batch
        outgrows the noise scale. Without statistics, 1 at B0 and B0 / B beyond (no gain
        is assumed from a bigger batch)."""
        scale = global_batch / self.limits.init_batch
        if self.grad is None:
            return 1.0 / scale if scale > 1 else 1.0
        denom = self.grad.var / scale + self.grad.sqr
        gain = (self.grad.var + self.grad.sqr) / denom if denom > 0 else 1.0
        return gain / scale

    def throughput(self, nodes: int, replicas: int, local_batch: int, accumulation: int) -> float:
        t = self.perf.step_time(nodes, replicas, local_batch, accumulation)
        if not t > 0 or not math.isfinite(t):
            return 0.0
        return replicas * local_batch * accumulation / t

    def evaluate(
        self, nodes: int, replicas: int, local_batch: int, accumulation: int
    ) -> BatchChoice:
        global_batch = replicas * local_batch * accumulation
        throughput = self.throughput(nodes, replicas, local_batch, accumulation)
        efficiency = self.efficiency(global_batch)
        return BatchChoice(
            local_batch, accumulation, global_batch, throughput, efficiency, throughput * efficiency
        )

    def candidates(self, replicas: int, grids: Grids | None = None) -> list[int]:
        """Samples per replica per step worth trying at `replicas`, ascending. `grids`
        keeps the grids a round already drew (the same (lo, hi) for many jobs and sizes)."""
        lim = self.limits
        lo = max(math.ceil(lim.init_batch / replicas), lim.min_local)
        if not lim.adaptive or self.grad is None:
            return [lo]
        hi = lim.max_batch // replicas
        if hi <= lo:
            return [lo]
        if grids is not None and (lo, hi) in grids:
            return grids[lo, hi]
        ratio = hi / lo
        grid = {lo, hi}
        for i in range(1, BATCH_GRID - 1):
            grid.add(round(lo * ratio ** (i / (BATCH_GRID - 1))))
        found = sorted(grid)
        if grids is not None:
            grids[lo, hi] = found
        return found

    def best_batch(
        self, nodes: int, replicas: int, grids: Grids | None = None
    ) -> BatchChoice | None:
        """The batch with the most goodput at this allocation (ties: the smaller batch);
        None when no batch within the limits fits it (e.g. more replicas than the
        largest batch has samples for its smallest local batch).

        A round asks this of hundreds of jobs at a dozen sizes each, 50 batches a size:
        the search is split-then-`evaluate` written out in one loop, the same operations
        in the same order (so the same floats to the last bit), without a call or an
        object per batch tried."""
        if replicas < 1 or nodes < 1 or nodes > replicas:
            return None
        lim, perf = self.limits, self.perf
        cap, max_batch, min_local = lim.local_cap, lim.max_batch, lim.min_local
        init = lim.init_batch
        accumulate = lim.accumulation
        pollux = type(perf) is PerfParams
        alpha_c = beta_c = gamma = network = 0.0
        if pollux:
            assert isinstance(perf, PerfParams)
            alpha_c, beta_c, gamma = perf.alpha_c, perf.beta_c, perf.gamma
            network = perf.network_time(nodes, replicas)
        statistics = self.grad is not None
        var = sqr = 0.0
        if self.grad is not None:
            var, sqr = self.grad.var, self.grad.sqr
        isfinite, ceil = math.isfinite, math.ceil
        best_goodput = 0.0
        best: tuple[int, int, float, float] | None = None
        for per_replica in self.candidates(replicas, grids):
            # the split: a local batch and micro-steps within the limits
            if accumulate:
                accumulation = ceil(per_replica / cap)  # (>= 1: per_replica, cap >= 1)
            elif per_replica <= cap:
                accumulation = 1
            else:
                continue
            local = ceil(per_replica / accumulation)
            most = max_batch // (replicas * accumulation)
            if most < local:
                local = most
            if local < min_local or local > cap:
                continue
            # evaluate: throughput x efficiency
            samples = replicas * local * accumulation
            if pollux:
                compute = alpha_c + beta_c * local
                if network <= 0:
                    last = compute
                elif gamma == 1.0:
                    last = compute + network
                else:
                    last = (compute**gamma + network**gamma) ** (1 / gamma)
                t = (accumulation - 1) * compute + last
            else:
                t = perf.step_time(nodes, replicas, local, accumulation)
            throughput = samples / t if t > 0 and isfinite(t) else 0.0
            scale = samples / init
            if statistics:
                denom = var / scale + sqr
                efficiency = ((var + sqr) / denom if denom > 0 else 1.0) / scale
            else:
                efficiency = 1.0 / scale if scale > 1 else 1.0
            goodput = throughput * efficiency
            if best is None or goodput > best_goodput:
                best_goodput = goodput
                best = (local, accumulation, throughput, efficiency)
        if best is None or best_goodput <= 0:
            return None
        local, accumulation, throughput, efficiency = best
        return BatchChoice(
            local,
            accumulation,
            replicas * local * accumulation,
            throughput,
            efficiency,
            best_goodput,
        )


#: Candidate grids a round has drawn, by (lo, hi) samples per replica (`candidates`).
Grids = dict[tuple[int, int], list[int]]


__all__ = [
    "BATCH_GRID",
    "BatchChoice",
    "BatchLimits",
    "GradStats",
    "Grids",
    "JobModel",
    "PerfParams",
    "StepSample",
    "StepTimeModel",
    "fit_perf_params",
]
